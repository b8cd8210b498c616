//! Progress of image builds for people: which image, which step, how long. On a terminal the
//! current step's elapsed time ticks in place (on stderr); otherwise each step is one plain
//! line, so logs and pipes stay readable.

use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::Step;

/// Reports [`Step`]s of the images being ensured.
pub struct Progress {
    terminal: bool,
    /// The step ticking now: (what, since).
    current: Arc<Mutex<Option<(String, Instant)>>>,
    ticker: Option<tokio::task::JoinHandle<()>>,
}

impl Progress {
    /// Progress on stderr; ticking when stderr is a terminal.
    pub fn stderr() -> Self {
        let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
        let current: Arc<Mutex<Option<(String, Instant)>>> = Arc::default();
        let ticker = terminal.then(|| {
            let current = current.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    if let Some((what, since)) = &*lock(&current) {
                        let mut e = std::io::stderr().lock();
                        let _ = write!(e, "\r\x1b[2K  {what} {}", elapsed(since.elapsed()));
                        let _ = e.flush();
                    }
                }
            })
        });
        Self {
            terminal,
            current,
            ticker,
        }
    }

    /// What to pass to [`crate::Pipeline::ensure_with`] for `image`.
    pub fn report(&self, image: &str, step: Step<'_>) {
        let started = lock(&self.current).take();
        let mut e = std::io::stderr().lock();
        if let Some((what, since)) = started {
            if self.terminal {
                let _ = write!(e, "\r\x1b[2K");
            }
            let _ = writeln!(e, "  {what} done in {}", elapsed(since.elapsed()));
        }
        let line = match step {
            Step::UpToDate(tag) => {
                let _ = writeln!(e, "  {tag}: up to date");
                return;
            }
            Step::Built(tag) => {
                let _ = writeln!(e, "  {tag}: built");
                return;
            }
            Step::Compiling(bin) => {
                format!("{image}: compiling {bin} (static, release; a few minutes the first time)")
            }
            Step::Fetching(package) => {
                format!("{image}: fetching {package} from PyPI (pinned; once, then cached)")
            }
            Step::Building => format!("{image}: building the image"),
        };
        if !self.terminal {
            let _ = writeln!(e, "  {line}");
        }
        *lock(&self.current) = Some((line, Instant::now()));
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(t) = self.ticker.take() {
            t.abort();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn elapsed(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn elapsed_reads_well() {
        use std::time::Duration;
        assert_eq!(super::elapsed(Duration::from_millis(2500)), "2.5s");
        assert_eq!(super::elapsed(Duration::from_secs(125)), "2m05s");
    }
}
