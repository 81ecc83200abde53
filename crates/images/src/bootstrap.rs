//! The Debian bootstrap, the first image source: choosing (or installing) mmdebstrap or
//! debootstrap, running it against the mirror, and finalising the fresh tree for sandboxes.

use std::path::{Path, PathBuf};

use tokio::process::Command;

use crate::error::{ImageError, Result};
use crate::exec::{TOOL_PATH, blocking, run_streaming, tool_command};
use crate::finalize::finalize;
use crate::fsutil::remove_tree;
use crate::mirror;
use crate::progress::Progress;
use crate::recipe::{TemplateRecipe, VARIANT};

/// The program that creates the Debian tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BootstrapTool {
    /// Preferred: apt resolves and downloads in parallel, so it is the faster of the two.
    Mmdebstrap,
    Debootstrap,
}

impl BootstrapTool {
    /// Program and Debian package name.
    pub fn name(self) -> &'static str {
        match self {
            BootstrapTool::Mmdebstrap => "mmdebstrap",
            BootstrapTool::Debootstrap => "debootstrap",
        }
    }

    /// What an operator runs to install it.
    pub fn install_command(self) -> String {
        format!("apt-get install -y {}", self.name())
    }
}

/// Finds `only` if given, else mmdebstrap, else debootstrap.
pub(crate) fn find_tool(only: Option<BootstrapTool>) -> Option<(BootstrapTool, PathBuf)> {
    let candidates = match only {
        Some(t) => vec![t],
        None => vec![BootstrapTool::Mmdebstrap, BootstrapTool::Debootstrap],
    };
    for tool in candidates {
        for dir in TOOL_PATH.split(':') {
            let p = Path::new(dir).join(tool.name());
            if is_executable(&p) {
                return Some((tool, p));
            }
        }
    }
    None
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `apt-get install -y <tool>`, with an `apt-get update` and retry if the first attempt fails
/// (a fresh host often has no package lists).
pub(crate) async fn install_tool(tool: BootstrapTool, progress: &dyn Progress) -> Result<()> {
    let command = tool.install_command();
    progress.stage(&format!("installing the bootstrap tool: {command}"));
    let install = || {
        let mut c = tool_command("apt-get");
        c.args(["install", "-y", tool.name()]);
        c
    };
    let (status, _) = run_streaming(install(), "apt-get install", progress).await?;
    if status.success() {
        return Ok(());
    }
    let mut update = tool_command("apt-get");
    update.arg("update");
    run_streaming(update, "apt-get update", progress).await?;
    let (status, tail) = run_streaming(install(), "apt-get install", progress).await?;
    if status.success() {
        Ok(())
    } else {
        Err(ImageError::ToolInstall {
            command,
            status: status.to_string(),
            tail,
        })
    }
}

/// The bootstrap command for `recipe`, writing a fresh tree at `target` (which must not exist).
pub(crate) fn bootstrap_command(
    tool: BootstrapTool,
    program: &Path,
    recipe: &TemplateRecipe,
    target: &Path,
    mirror: &str,
) -> Command {
    let mut packages: Vec<&str> = recipe.packages.iter().map(String::as_str).collect();
    packages.sort_unstable();
    packages.dedup();
    let include = format!("--include={}", packages.join(","));
    let mut c = tool_command(program);
    match tool {
        BootstrapTool::Mmdebstrap => {
            c.args([
                "--mode=root",
                &format!("--variant={VARIANT}"),
                "--format=directory",
                // Package-level lines (apt/dpkg) for the progress display.
                "--verbose",
                "--aptopt=Acquire::Retries \"3\"",
            ]);
        }
        BootstrapTool::Debootstrap => {
            c.args([&format!("--variant={VARIANT}"), "--components=main"]);
        }
    }
    if !packages.is_empty() {
        c.arg(include);
    }
    c.arg(&recipe.suite).arg(target).arg(mirror);
    c
}

/// The Debian image source: a fresh `minbase` tree of the recipe's suite and packages, then
/// [`finalize`]d (extra CA, the sandbox user, slimming).
pub(crate) struct DebianBootstrap<'a> {
    pub recipe: &'a TemplateRecipe,
    pub mirror: &'a str,
    /// Use only this tool; `None` = mmdebstrap if installed, else debootstrap.
    pub tool: Option<BootstrapTool>,
    /// Run `apt-get install` for a missing tool instead of failing.
    pub install_missing_tools: bool,
    /// The extra CA bundle's bytes (read once, so the hash and the installed file agree).
    pub extra_ca: Option<&'a [u8]>,
}

impl DebianBootstrap<'_> {
    /// Builds the tree at `target` (which must not exist); returns the tool's name.
    pub async fn produce(&self, target: &Path, progress: &dyn Progress) -> Result<String> {
        let recipe = self.recipe;
        let (tool, program) = match find_tool(self.tool) {
            Some(t) => t,
            None => {
                let wanted = self.tool.unwrap_or(BootstrapTool::Mmdebstrap);
                if !self.install_missing_tools {
                    return Err(ImageError::ToolMissing {
                        install_command: wanted.install_command(),
                    });
                }
                install_tool(wanted, progress).await?;
                find_tool(Some(wanted)).ok_or_else(|| ImageError::ToolMissing {
                    install_command: wanted.install_command(),
                })?
            }
        };
        mirror::check(self.mirror, &recipe.suite, progress).await?;

        progress.stage(&format!(
            "bootstrapping {} {} with {} ({} packages)",
            recipe.id,
            recipe.suite,
            tool.name(),
            recipe.packages.len()
        ));
        let cmd = bootstrap_command(tool, &program, recipe, target, self.mirror);
        let (status, tail) = run_streaming(cmd, tool.name(), progress).await?;
        if !status.success() {
            let tmp = target.to_owned();
            // Keep the error even if cleanup fails; the next build retries the cleanup.
            if let Err(e) = blocking(move || remove_tree(&tmp)).await {
                tracing::warn!(error = %e, "cannot remove the failed build");
            }
            return Err(ImageError::Bootstrap {
                tool: tool.name().to_owned(),
                suite: recipe.suite.clone(),
                status: status.to_string(),
                tail,
            });
        }

        finalize(target, self.extra_ca, progress).await?;
        Ok(tool.name().to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_have_the_recipe() {
        let r = TemplateRecipe::debian();
        let c = bootstrap_command(
            BootstrapTool::Debootstrap,
            Path::new("/usr/sbin/debootstrap"),
            &r,
            Path::new("/t"),
            "http://m/debian",
        );
        let args: Vec<String> = c
            .as_std()
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            args,
            [
                "--variant=minbase",
                "--components=main",
                "--include=bash,build-essential,ca-certificates,coreutils,curl,gh,git,iproute2,less,netbase,procps,python-is-python3,python3,python3-dev,python3-pip,python3-venv,sudo,unzip,wget,xz-utils,zip",
                "bookworm",
                "/t",
                "http://m/debian"
            ]
        );
        let c = bootstrap_command(
            BootstrapTool::Mmdebstrap,
            Path::new("/usr/bin/mmdebstrap"),
            &r,
            Path::new("/t"),
            "http://m/debian",
        );
        let args: Vec<String> = c
            .as_std()
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert!(args.contains(&"--mode=root".to_owned()));
        assert!(args.ends_with(&["bookworm".into(), "/t".into(), "http://m/debian".into()]));
    }
}
