//! Build progress reporting: a spinner for terminals, plain lines for logs and CI.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// Receives a build's progress. `stage` marks a new phase, `line` is one line of tool output
/// (mmdebstrap, debootstrap, apt, chroot commands), `done` ends the report (success or not).
pub trait Progress: Send + Sync {
    fn stage(&self, msg: &str);
    fn line(&self, line: &str);
    fn done(&self);
}

/// A progress that reports nothing, for the crate's unit tests.
#[cfg(test)]
pub(crate) struct Quiet;

#[cfg(test)]
impl Progress for Quiet {
    fn stage(&self, _: &str) {}
    fn line(&self, _: &str) {}
    fn done(&self) {}
}

/// What one package is going through, as reported by debootstrap, apt or dpkg.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackageStep {
    Retrieving,
    Validating,
    Extracting,
    Unpacking,
    Configuring,
}

impl PackageStep {
    pub fn as_str(self) -> &'static str {
        match self {
            PackageStep::Retrieving => "retrieving",
            PackageStep::Validating => "validating",
            PackageStep::Extracting => "extracting",
            PackageStep::Unpacking => "unpacking",
            PackageStep::Configuring => "configuring",
        }
    }
}

/// A tool output line, interpreted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Activity<'a> {
    Package(PackageStep, &'a str),
    /// An `I: …` phase announcement that does not name a package.
    Phase(&'a str),
}

/// Recognises the lines worth showing from debootstrap (`I: Retrieving libc6 2.36-9`,
/// `I: Configuring libc-bin...`), mmdebstrap (`I: installing essential packages...`), apt
/// (`Get:12 http://… bookworm/main amd64 libc6 amd64 2.36-9 [2757 kB]`) and dpkg
/// (`Unpacking libc6:amd64 (2.36-9) ...`, `Setting up libc6:amd64 (2.36-9) ...`).
pub fn parse_activity(line: &str) -> Option<Activity<'_>> {
    let line = line.trim();
    if let Some(rest) = line.strip_prefix("I: ") {
        // Retrieving/Validating name the package and its version; the others only the package
        // (`Unpacking libc6:amd64...`). Other shapes (`Unpacking the base system...`,
        // `Configuring required packages...`, `Retrieving InRelease`) are phases.
        for (verb, step, tokens) in [
            ("Retrieving ", PackageStep::Retrieving, 2),
            ("Validating ", PackageStep::Validating, 2),
            ("Extracting ", PackageStep::Extracting, 1),
            ("Unpacking ", PackageStep::Unpacking, 1),
            ("Configuring ", PackageStep::Configuring, 1),
        ] {
            if let Some(what) = rest.strip_prefix(verb) {
                let what = what.trim().trim_end_matches("...");
                let words: Vec<&str> = what.split_whitespace().collect();
                let name = words
                    .first()
                    .map_or("", |w| w.split(':').next().unwrap_or(w));
                if words.len() == tokens && is_package_like(name) {
                    return Some(Activity::Package(step, name));
                }
                break;
            }
        }
        return Some(Activity::Phase(rest.trim_end_matches("...")));
    }
    if line.starts_with("Get:") {
        // Get:N URI DIST[/COMP] ARCH PKG ARCH VERSION [SIZE]
        let t: Vec<&str> = line.split_whitespace().collect();
        if t.len() >= 7 && is_package_like(t[4]) {
            return Some(Activity::Package(PackageStep::Retrieving, t[4]));
        }
        return None;
    }
    if let Some(activity) = parse_pip_npm(line) {
        return Some(activity);
    }
    for (verb, step) in [
        ("Unpacking ", PackageStep::Unpacking),
        ("Setting up ", PackageStep::Configuring),
    ] {
        if let Some(rest) = line.strip_prefix(verb) {
            let name = rest.split_whitespace().next().unwrap_or("");
            let name = name.split(':').next().unwrap_or(name);
            if is_package_like(name) {
                return Some(Activity::Package(step, name));
            }
        }
    }
    None
}

/// pip (`Collecting numpy==2.4.6`, `Installing collected packages: …`) and npm with
/// `--loglevel=http` (`npm http fetch GET 200 https://registry.npmjs.org/deno/-/deno-2.9.6.tgz …`,
/// `added 3 packages in 3s`), as seen while building layered templates.
fn parse_pip_npm(line: &str) -> Option<Activity<'_>> {
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-' | b'@' | b'/'))
    };
    if let Some(rest) = line.strip_prefix("Collecting ") {
        let spec = rest.split_whitespace().next().unwrap_or("");
        let name = spec
            .split(['=', '<', '>', '!', '~', '[', ';'])
            .next()
            .unwrap_or("");
        return name_ok(name).then_some(Activity::Package(PackageStep::Retrieving, name));
    }
    if line.starts_with("Installing collected packages:") {
        return Some(Activity::Phase("installing the Python packages"));
    }
    if line.starts_with("Successfully installed ") {
        return Some(Activity::Phase("Python packages installed"));
    }
    if let Some(rest) = line.strip_prefix("npm http fetch GET ") {
        // `<status> <url> …`: the package is the URL path before `/-/` (tarballs) or all of it
        // (metadata), scoped names included.
        let url = rest.split_whitespace().nth(1)?;
        let path = url.split_once("://")?.1.split_once('/')?.1;
        let name = path.split("/-/").next().unwrap_or(path);
        return name_ok(name).then_some(Activity::Package(PackageStep::Retrieving, name));
    }
    if line.starts_with("added ") && line.contains(" package") {
        return Some(Activity::Phase(line));
    }
    None
}

fn is_package_like(s: &str) -> bool {
    s.len() >= 2
        && s.bytes().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'+' | b'-' | b'.')
        })
}

/// Stages are printed as lines above the spinner, so the spinner line itself has room for the
/// package being worked on even in an 80-column terminal.
const SPINNER_TEMPLATE: &str = "{spinner:.cyan} [{elapsed_precise}] {wide_msg}";

/// Spinner with elapsed time and the package being worked on; each stage is printed once as a
/// line above it.
#[derive(Debug)]
pub struct IndicatifProgress {
    bar: ProgressBar,
    started: Instant,
    packages: Mutex<usize>,
}

impl IndicatifProgress {
    pub fn new() -> Self {
        let bar = ProgressBar::new_spinner();
        // The template is a constant; a parse failure would be a programming error caught by
        // the unit test, so fall back to the default style rather than panic.
        if let Ok(style) = ProgressStyle::with_template(SPINNER_TEMPLATE) {
            bar.set_style(style);
        }
        bar.enable_steady_tick(Duration::from_millis(120));
        IndicatifProgress {
            bar,
            started: Instant::now(),
            packages: Mutex::new(0),
        }
    }
}

impl Default for IndicatifProgress {
    fn default() -> Self {
        Self::new()
    }
}

impl Progress for IndicatifProgress {
    fn stage(&self, msg: &str) {
        self.bar.println(format!(
            "[{:>6.1}s] {msg}",
            self.started.elapsed().as_secs_f64()
        ));
        self.bar.set_prefix(msg.to_owned());
        self.bar.set_message("");
    }

    fn line(&self, line: &str) {
        match parse_activity(line) {
            Some(Activity::Package(step, name)) => {
                let mut n = self.packages.lock().unwrap_or_else(|e| e.into_inner());
                if step == PackageStep::Configuring {
                    *n += 1;
                }
                self.bar
                    .set_message(format!("{} {name} ({} configured)", step.as_str(), *n));
            }
            Some(Activity::Phase(p)) => self.bar.set_message(p.to_owned()),
            None => {}
        }
    }

    fn done(&self) {
        self.bar.finish_and_clear();
        // Straight to stderr: the bar is finished, so nothing will redraw over it.
        let _ = writeln!(
            std::io::stderr(),
            "[{:>6.1}s] done",
            self.started.elapsed().as_secs_f64()
        );
    }
}

/// Plain timestamped lines on stderr (or any writer), for logs and CI.
pub struct LogProgress {
    started: Instant,
    out: Mutex<Box<dyn Write + Send>>,
    /// Also print every tool output line, not only stages.
    verbose: bool,
}

impl std::fmt::Debug for LogProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogProgress")
            .field("verbose", &self.verbose)
            .finish_non_exhaustive()
    }
}

impl LogProgress {
    /// Stages and every tool output line, on stderr.
    pub fn new() -> Self {
        Self::to_writer(Box::new(std::io::stderr()), true)
    }

    /// Stages only, on stderr.
    pub fn quiet() -> Self {
        Self::to_writer(Box::new(std::io::stderr()), false)
    }

    pub fn to_writer(out: Box<dyn Write + Send>, verbose: bool) -> Self {
        LogProgress {
            started: Instant::now(),
            out: Mutex::new(out),
            verbose,
        }
    }

    fn emit(&self, text: std::fmt::Arguments<'_>) {
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        // Progress output is best effort; a closed stderr must not fail the build.
        let _ = writeln!(
            out,
            "[{:>6.1}s] {text}",
            self.started.elapsed().as_secs_f64()
        );
    }
}

impl Default for LogProgress {
    fn default() -> Self {
        Self::new()
    }
}

impl Progress for LogProgress {
    fn stage(&self, msg: &str) {
        self.emit(format_args!("== {msg}"));
    }

    fn line(&self, line: &str) {
        if self.verbose {
            self.emit(format_args!("   {line}"));
        }
    }

    fn done(&self) {
        self.emit(format_args!("== done"));
    }
}

/// A spinner when stderr is a terminal, otherwise plain stage lines.
pub fn auto_progress() -> Box<dyn Progress> {
    if std::io::stderr().is_terminal() {
        Box::new(IndicatifProgress::new())
    } else {
        Box::new(LogProgress::quiet())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_debootstrap_lines() {
        use Activity::*;
        use PackageStep::*;
        assert_eq!(
            parse_activity("I: Retrieving libc6 2.36-9+deb12u10"),
            Some(Package(Retrieving, "libc6"))
        );
        assert_eq!(
            parse_activity("I: Validating libacl1 2.3.1-3"),
            Some(Package(Validating, "libacl1"))
        );
        assert_eq!(
            parse_activity("I: Extracting libstdc++6..."),
            Some(Package(Extracting, "libstdc++6"))
        );
        assert_eq!(
            parse_activity("I: Unpacking libacl1:amd64..."),
            Some(Package(Unpacking, "libacl1"))
        );
        assert_eq!(
            parse_activity("I: Configuring python3.11..."),
            Some(Package(Configuring, "python3.11"))
        );
        assert_eq!(
            parse_activity("I: Unpacking the base system..."),
            Some(Phase("Unpacking the base system"))
        );
        assert_eq!(
            parse_activity("I: Retrieving InRelease "),
            Some(Phase("Retrieving InRelease"))
        );
        assert_eq!(
            parse_activity("I: Configuring required packages..."),
            Some(Phase("Configuring required packages"))
        );
        assert_eq!(
            parse_activity("I: Retrieving Packages "),
            Some(Phase("Retrieving Packages"))
        );
    }

    #[test]
    fn parses_apt_and_dpkg_lines() {
        use Activity::*;
        use PackageStep::*;
        assert_eq!(
            parse_activity(
                "Get:12 http://deb.debian.org/debian bookworm/main amd64 libc6 amd64 2.36-9 [2757 kB]"
            ),
            Some(Package(Retrieving, "libc6"))
        );
        assert_eq!(
            parse_activity("Get:1 http://deb.debian.org/debian bookworm InRelease [151 kB]"),
            None
        );
        assert_eq!(
            parse_activity("Unpacking passwd (1:4.13+dfsg1-1+deb12u2) ..."),
            Some(Package(Unpacking, "passwd"))
        );
        assert_eq!(
            parse_activity("Setting up libsemanage2:amd64 (3.4-1+b5) ..."),
            Some(Package(Configuring, "libsemanage2"))
        );
        assert_eq!(
            parse_activity("I: installing essential packages..."),
            Some(Phase("installing essential packages"))
        );
        assert_eq!(
            parse_activity("Preparing to unpack .../03-libsemanage2_3.4-1+b5_amd64.deb ..."),
            None
        );
    }

    #[test]
    fn parses_pip_and_npm_lines() {
        use Activity::*;
        use PackageStep::*;
        assert_eq!(
            parse_activity("Collecting typing_extensions==4.16.0"),
            Some(Package(Retrieving, "typing_extensions"))
        );
        assert_eq!(
            parse_activity("Collecting numpy>=1.23 (from pandas==3.1.1)"),
            Some(Package(Retrieving, "numpy"))
        );
        assert_eq!(
            parse_activity("Installing collected packages: pure-eval, ptyprocess"),
            Some(Phase("installing the Python packages"))
        );
        assert_eq!(
            parse_activity(
                "npm http fetch GET 200 https://registry.npmjs.org/deno/-/deno-2.9.6.tgz 430ms (cache miss)"
            ),
            Some(Package(Retrieving, "deno"))
        );
        assert_eq!(
            parse_activity(
                "npm http fetch GET 200 https://registry.npmjs.org/@deno/linux-x64-glibc/-/linux-x64-glibc-2.9.6.tgz 1s"
            ),
            Some(Package(Retrieving, "@deno/linux-x64-glibc"))
        );
        assert_eq!(
            parse_activity("added 3 packages in 3s"),
            Some(Phase("added 3 packages in 3s"))
        );
        assert_eq!(
            parse_activity("  Downloading numpy-2.4.6.whl (16 MB)"),
            None
        );
    }

    #[test]
    fn spinner_template_parses() {
        ProgressStyle::with_template(SPINNER_TEMPLATE).unwrap();
    }

    #[test]
    fn log_progress_writes_lines() {
        #[derive(Clone, Default)]
        struct Buf(std::sync::Arc<Mutex<Vec<u8>>>);
        impl Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let p = LogProgress::to_writer(Box::new(buf.clone()), false);
        p.stage("bootstrapping");
        p.line("hidden");
        p.done();
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert!(text.contains("== bootstrapping"));
        assert!(!text.contains("hidden"));
        assert!(text.contains("== done"));
    }
}
