//! Where chat lines come from and replies go: a pipe (lines in, only replies out) or a person
//! at a terminal (a prompt with line editing and history by rustyline; replies printed above
//! the prompt as they arrive, so a follow-up can be typed while the agent answers; a spinner
//! while it works).

use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncBufReadExt as _;
use tokio::sync::mpsc;

/// The longest line accepted: a prompt, not a file upload.
pub const MAX_LINE: usize = 1 << 20;

/// What the person (or the pipe) did.
#[derive(Debug)]
pub enum Input {
    /// A line to send.
    Line(String),
    /// Ctrl-C.
    Interrupt,
    /// End of input (Ctrl-D, the pipe closed).
    End,
    /// Reading failed.
    Failed(String),
}

/// Prints replies, notes and the spinner; the same calls whether a person or a pipe reads.
#[derive(Clone)]
pub struct Screen {
    printer: Option<Arc<Mutex<Box<dyn rustyline::ExternalPrinter + Send>>>>,
    /// While the agent works: since when (for the spinner).
    working: Arc<Mutex<Option<Instant>>>,
}

fn lock<T: ?Sized>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Screen {
    /// A reply: on a terminal `agent> …` above the prompt; through a pipe, the text alone.
    pub fn reply(&self, text: &str) {
        let text = crate::terminal_safe(text);
        match &self.printer {
            Some(p) => {
                let _ = lock(p).print(format!("agent> {text}\n"));
            }
            None => {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{text}");
                let _ = out.flush();
            }
        }
    }

    /// A note for the person (errors, status, what happens): stderr, or above the prompt.
    pub fn note(&self, text: &str) {
        let text = crate::terminal_safe(text);
        match &self.printer {
            Some(p) => {
                let _ = lock(p).print(format!("\x1b[2m{text}\x1b[0m\n"));
            }
            // Never `eprintln!`: it panics when stderr is a terminal that hung up, and the
            // chat must still stop its container then.
            None => {
                let _ = writeln!(std::io::stderr().lock(), "{text}");
            }
        }
    }

    /// The agent started or stopped working (the spinner's state).
    pub fn working(&self, yes: bool) {
        *lock(&self.working) = yes.then(Instant::now);
    }
}

/// A screen for a pipe: replies to stdout, notes to stderr.
pub fn start_pipe_screen() -> Screen {
    Screen {
        printer: None,
        working: Arc::default(),
    }
}

/// Starts reading input. On a terminal: rustyline on a thread of its own (it blocks), with
/// history in `history`; otherwise lines from stdin. Answers the screen replies go to and the
/// inputs as they come.
pub fn start(history: Option<PathBuf>) -> (Screen, mpsc::Receiver<Input>) {
    let (tx, rx) = mpsc::channel(16);
    let interactive = std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
    let working: Arc<Mutex<Option<Instant>>> = Arc::default();
    if interactive && let Ok(mut editor) = rustyline::DefaultEditor::new() {
        if let Some(h) = &history {
            let _ = editor.load_history(h);
        }
        let printer = editor.create_external_printer().ok().map(|p| {
            Arc::new(Mutex::new(
                Box::new(p) as Box<dyn rustyline::ExternalPrinter + Send>
            ))
        });
        let screen = Screen {
            printer: printer.clone(),
            working: working.clone(),
        };
        std::thread::spawn(move || read_terminal(editor, history, tx));
        if let Some(p) = printer {
            tokio::spawn(spin(p, working));
        }
        return (screen, rx);
    }
    tokio::spawn(read_pipe(tx));
    (
        Screen {
            printer: None,
            working,
        },
        rx,
    )
}

fn read_terminal(
    mut editor: rustyline::DefaultEditor,
    history: Option<PathBuf>,
    tx: mpsc::Sender<Input>,
) {
    use rustyline::error::ReadlineError;
    loop {
        let input = match editor.readline("you> ") {
            Ok(line) if line.len() > MAX_LINE => {
                Input::Failed(format!("a line longer than {MAX_LINE} bytes"))
            }
            Ok(line) => {
                if line.trim().is_empty() {
                    continue;
                }
                let _ = editor.add_history_entry(line.as_str());
                Input::Line(line)
            }
            Err(ReadlineError::Interrupted) => Input::Interrupt,
            Err(ReadlineError::Eof) => Input::End,
            Err(e) => Input::Failed(e.to_string()),
        };
        let last = !matches!(input, Input::Line(_));
        if tx.blocking_send(input).is_err() || last {
            break;
        }
    }
    if let Some(h) = history {
        if let Some(dir) = h.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let _ = editor.save_history(&h);
    }
}

async fn read_pipe(tx: mpsc::Sender<Input>) {
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin());
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = tokio::io::AsyncReadExt::take(&mut stdin, MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .await;
        let input = match read {
            Ok(0) => Input::End,
            Ok(_) if line.len() > MAX_LINE => {
                Input::Failed(format!("a line longer than {MAX_LINE} bytes"))
            }
            Ok(_) => match String::from_utf8(std::mem::take(&mut line)) {
                Ok(s) => {
                    let s = s.trim_end_matches(['\n', '\r']);
                    if s.trim().is_empty() {
                        continue;
                    }
                    Input::Line(s.to_owned())
                }
                Err(_) => Input::Failed("input is not UTF-8".into()),
            },
            Err(e) => Input::Failed(e.to_string()),
        };
        let last = !matches!(input, Input::Line(_));
        if tx.send(input).await.is_err() || last {
            return;
        }
    }
}

/// The spinner: a line above the prompt that says the agent works, and for how long, every
/// few seconds while it does (rustyline keeps the prompt and what is typed intact).
async fn spin(
    printer: Arc<Mutex<Box<dyn rustyline::ExternalPrinter + Send>>>,
    working: Arc<Mutex<Option<Instant>>>,
) {
    const FRAMES: &[&str] = &["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];
    let mut i = 0;
    loop {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let since = *lock(&working);
        if let Some(t) = since {
            i = (i + 1) % FRAMES.len();
            let _ = lock(&printer).print(format!(
                "\x1b[2m{} the agent is working ({}s)\x1b[0m\n",
                FRAMES[i],
                t.elapsed().as_secs()
            ));
        }
    }
}
