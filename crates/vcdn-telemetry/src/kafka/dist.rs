//! Where the Kafka distribution lives: the runtime jars that
//! `scripts/kafka.sh` gathers from Maven Central, and the `java` that runs
//! them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The Kafka version `scripts/kafka.sh` fetches (pinned there too).
pub const KAFKA_VERSION: &str = "4.3.1";

/// The marker `scripts/kafka.sh` writes after the last jar is in place.
const MARKER: &str = ".complete";

/// Why the distribution cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    #[error(
        "Kafka {KAFKA_VERSION} is not installed in {0} (no {MARKER} marker): run scripts/kafka.sh \
         (or set VCDN_KAFKA_HOME to where it put the jars)"
    )]
    Missing(PathBuf),
    #[error(
        "no Java runtime found to run Kafka ({0}): install a JDK >= 17 \
         (scripts/kafka.sh installs openjdk-17-jre-headless) or set JAVA_HOME"
    )]
    NoJava(String),
}

/// A located Kafka distribution: `home/libs/*.jar` and a working `java`.
#[derive(Debug, Clone)]
pub struct KafkaDist {
    home: PathBuf,
    java: PathBuf,
}

impl KafkaDist {
    /// Finds the distribution in `$VCDN_KAFKA_HOME`, else in
    /// `$XDG_CACHE_HOME/vcdn/kafka-4.3.1` (`$XDG_CACHE_HOME` defaulting to
    /// `$HOME/.cache`, as in `scripts/kafka.sh`),
    /// and the `java` in `$JAVA_HOME/bin`, else on `PATH`. Fails with an
    /// error that says what to run rather than letting a broker start fail
    /// later with a class-not-found.
    pub fn locate() -> Result<KafkaDist, DistError> {
        let home = match std::env::var_os("VCDN_KAFKA_HOME") {
            Some(h) if !h.is_empty() => PathBuf::from(h),
            _ => cache_home().join(format!("vcdn/kafka-{KAFKA_VERSION}")),
        };
        Self::at(&home)
    }

    /// The distribution in `home` (see [`KafkaDist::locate`]).
    pub fn at(home: &Path) -> Result<KafkaDist, DistError> {
        if !home.join(MARKER).is_file() || !home.join("libs").is_dir() {
            return Err(DistError::Missing(home.to_path_buf()));
        }
        let java = find_java()?;
        Ok(KafkaDist {
            home: home.to_path_buf(),
            java,
        })
    }

    /// The directory holding `libs/`.
    pub fn home(&self) -> &Path {
        &self.home
    }

    /// The `java` executable.
    pub fn java(&self) -> &Path {
        &self.java
    }

    /// The JVM class path: every jar in `libs/` (the JVM expands `libs/*`).
    pub fn classpath(&self) -> String {
        format!("{}/libs/*", self.home.display())
    }

    /// A `java` command with the class path set, ready for a main class.
    pub fn java_command(&self) -> Command {
        let mut cmd = Command::new(&self.java);
        cmd.arg("-cp").arg(self.classpath());
        cmd
    }
}

/// The user's cache directory: `$XDG_CACHE_HOME` when set and not empty,
/// else `$HOME/.cache`: what `${XDG_CACHE_HOME:-$HOME/.cache}` gives
/// `scripts/kafka.sh`, so both name the same place.
fn cache_home() -> PathBuf {
    match std::env::var_os("XDG_CACHE_HOME") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache")
        }
    }
}

fn find_java() -> Result<PathBuf, DistError> {
    let candidate = match std::env::var_os("JAVA_HOME") {
        Some(h) if !h.is_empty() => PathBuf::from(h).join("bin/java"),
        _ => PathBuf::from("java"),
    };
    match Command::new(&candidate).arg("-version").output() {
        Ok(out) if out.status.success() => Ok(candidate),
        Ok(out) => Err(DistError::NoJava(format!(
            "{} -version exited with {}",
            candidate.display(),
            out.status
        ))),
        Err(e) => Err(DistError::NoJava(format!("{}: {e}", candidate.display()))),
    }
}
