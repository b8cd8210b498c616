//! How a run ended, and what that means for the turn.
//!
//! The rules, from the lessons of the systems hako replaces:
//! - output that reached the user is never rolled back: any `ok` or `error` block makes the
//!   outcome `ok` or `error`, whatever happened afterwards (timeout, crash, non-zero exit);
//! - a kill is its own outcome and is never retried;
//! - exit codes 125/126/127 and a missing image are terminal: retrying cannot help;
//! - no usable output is `fatal` (retryable), or `timed_out` when the ceiling cut it.

use hako_shared::contract::BlockStatus;
use hako_shared::runs::{Outcome, RunState};

/// How the container's life ended, as the supervisor saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// It exited by itself.
    Exited(i64),
    /// The run ceiling stopped it.
    TimedOut(Option<i64>),
    /// The caller killed it.
    Killed(Option<i64>),
    /// It never ran, or Docker failed around it.
    Failed {
        /// What went wrong.
        error: String,
        /// Whether a retry cannot help.
        terminal: bool,
    },
}

/// The verdict on a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The final state.
    pub state: RunState,
    /// What it means for the turn.
    pub outcome: Outcome,
    /// Whether the failure is permanent (never retry).
    pub terminal: bool,
    /// The explanation, for failures.
    pub error: Option<String>,
}

/// Exit codes that mean the container could not run its command at all.
pub fn is_terminal_exit(code: i64) -> bool {
    matches!(code, 125..=127)
}

/// Decides the state and outcome from the ending and the statuses of the blocks seen.
pub fn decide(ending: &Ending, statuses: &[BlockStatus]) -> Verdict {
    let delivered: Vec<BlockStatus> = statuses
        .iter()
        .copied()
        .filter(|s| *s != BlockStatus::Fatal)
        .collect();
    // Once something reached the user, the turn is answered.
    let answered = delivered.last().map(|last| match last {
        BlockStatus::Ok => Outcome::Ok,
        _ => Outcome::Error,
    });
    let v = |state, outcome, terminal, error: Option<String>| Verdict {
        state,
        outcome,
        terminal,
        error,
    };
    match ending {
        Ending::Killed(_) => v(
            RunState::Killed,
            Outcome::Killed,
            true,
            Some("killed on request".into()),
        ),
        // Lost around the container after it answered: the answer stands (an answered
        // outcome is never retried, whatever `terminal` says).
        Ending::Failed { error, terminal } if answered.is_some() => v(
            RunState::Error,
            answered.unwrap_or(Outcome::Error),
            *terminal,
            Some(error.clone()),
        ),
        Ending::Failed { error, terminal } => v(
            RunState::Error,
            if *terminal {
                Outcome::Error
            } else {
                Outcome::Fatal
            },
            *terminal,
            Some(error.clone()),
        ),
        Ending::TimedOut(_) => match answered {
            Some(o) => v(RunState::TimedOut, o, false, None),
            None => v(
                RunState::TimedOut,
                Outcome::TimedOut,
                false,
                Some("run ceiling reached without output".into()),
            ),
        },
        Ending::Exited(code) if is_terminal_exit(*code) && answered.is_none() => v(
            RunState::Exited,
            Outcome::Error,
            true,
            Some(format!(
                "container exited {code}: the image's command could not run (terminal, not retried)"
            )),
        ),
        Ending::Exited(code) => match answered {
            Some(o) => v(RunState::Exited, o, false, None),
            None if statuses.contains(&BlockStatus::Fatal) => v(
                RunState::Exited,
                Outcome::Fatal,
                false,
                Some(format!("agent reported fatal (exit {code})")),
            ),
            None => v(
                RunState::Exited,
                Outcome::Fatal,
                false,
                Some(format!("agent exited {code} without output")),
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use BlockStatus::{Error as E, Fatal as F, Ok as K};

    #[test]
    fn output_is_never_rolled_back() {
        assert_eq!(
            decide(&Ending::TimedOut(Some(137)), &[K]).outcome,
            Outcome::Ok
        );
        assert_eq!(
            decide(&Ending::TimedOut(None), &[K]).state,
            RunState::TimedOut
        );
        assert_eq!(decide(&Ending::Exited(1), &[K]).outcome, Outcome::Ok);
        assert_eq!(decide(&Ending::Exited(0), &[K, F]).outcome, Outcome::Ok);
        assert_eq!(decide(&Ending::Exited(0), &[K, E]).outcome, Outcome::Error);
        assert_eq!(decide(&Ending::Exited(127), &[K]).outcome, Outcome::Ok);
    }

    #[test]
    fn a_failure_after_an_answer_keeps_the_answer() {
        let lost = Ending::Failed {
            error: "the container is gone".into(),
            terminal: false,
        };
        let v = decide(&lost, &[BlockStatus::Ok]);
        assert_eq!((v.state, v.outcome), (RunState::Error, Outcome::Ok));
        let v = decide(&lost, &[BlockStatus::Fatal]);
        assert_eq!((v.outcome, v.terminal), (Outcome::Fatal, false));
    }

    #[test]
    fn no_output_is_retryable() {
        let t = decide(&Ending::TimedOut(Some(137)), &[]);
        assert_eq!((t.outcome, t.terminal), (Outcome::TimedOut, false));
        assert_eq!(decide(&Ending::Exited(0), &[]).outcome, Outcome::Fatal);
        assert_eq!(decide(&Ending::Exited(3), &[F]).outcome, Outcome::Fatal);
    }

    #[test]
    fn kills_and_terminal_exits_are_final() {
        let k = decide(&Ending::Killed(Some(137)), &[K]);
        assert_eq!(
            (k.state, k.outcome, k.terminal),
            (RunState::Killed, Outcome::Killed, true)
        );
        for code in [125, 126, 127] {
            let v = decide(&Ending::Exited(code), &[]);
            assert_eq!((v.outcome, v.terminal), (Outcome::Error, true), "{code}");
        }
        let missing = decide(
            &Ending::Failed {
                error: "image x not found".into(),
                terminal: true,
            },
            &[],
        );
        assert_eq!(
            (missing.state, missing.outcome, missing.terminal),
            (RunState::Error, Outcome::Error, true)
        );
        let docker_down = decide(
            &Ending::Failed {
                error: "docker down".into(),
                terminal: false,
            },
            &[],
        );
        assert_eq!(docker_down.outcome, Outcome::Fatal);
    }
}
