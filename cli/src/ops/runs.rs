//! `hako runs`: runed's runs.

use hako_client::runed;
use hako_shared::contract::{BlockStatus, OutputBlock};
use hako_shared::runs::RunStreamEvent;

use super::{OpsArgs, or_dash, print_json};

/// `hako runs …`.
#[derive(Debug, clap::Args)]
pub struct RunsArgs {
    #[command(subcommand)]
    pub command: RunsCommand,
    #[command(flatten)]
    pub ops: OpsArgs,
}

/// What to do with runs (runed).
#[derive(Debug, clap::Subcommand)]
pub enum RunsCommand {
    /// Runs, newest first.
    #[command(
        after_help = "Examples:\n  hako runs list\n  hako runs list --folder team --state running --json"
    )]
    List {
        /// Only this folder and those below it.
        #[arg(long)]
        folder: Option<String>,
        /// Only runs in this state (queued, starting, running, exited, error, killed, timed_out).
        #[arg(long)]
        state: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// One run: state, outcome, its output.
    Show {
        /// The run id.
        run: String,
    },
    /// Stop a run (stop, kill, remove its container); a kill is never retried.
    Kill {
        /// The run id.
        run: String,
    },
    /// A run's output blocks; `--follow` streams them until the run ends.
    Logs {
        /// The run id.
        run: String,
        /// Keep printing blocks as they come until the run is over.
        #[arg(long)]
        follow: bool,
    },
}

fn print_block(b: &OutputBlock) {
    match b.status {
        BlockStatus::Ok => println!("{}", b.result.as_deref().unwrap_or("")),
        st => println!("[{}] {}", st.as_str(), b.error.as_deref().unwrap_or("")),
    }
}

/// `hako runs`.
pub async fn runs(args: RunsArgs) -> anyhow::Result<bool> {
    let d = args.ops.daemons()?;
    let token = d.operator_token().await?;
    let json = args.ops.json;
    match args.command {
        RunsCommand::List {
            folder,
            state,
            limit,
        } => {
            let op = runed::runs()
                .query("limit", limit.clamp(1, 1000))
                .query_opt("folder", folder)
                .query_opt("state", state);
            let list = d.call(op, &token).await?;
            if json {
                print_json(&list);
                return Ok(true);
            }
            println!(
                "{:<24} {:<16} {:<9} {:<9} {:<24} created",
                "run", "folder", "state", "outcome", "turn"
            );
            for r in &list.runs {
                println!(
                    "{:<24} {:<16} {:<9} {:<9} {:<24} {}",
                    r.run_id,
                    r.folder,
                    r.state,
                    or_dash(r.outcome),
                    r.turn_id,
                    r.created_at
                );
            }
        }
        RunsCommand::Show { run } => {
            let r = d.call(runed::run(&run), &token).await?;
            if json {
                print_json(&r);
                return Ok(true);
            }
            for (k, v) in [
                ("run_id", r.run_id.to_string()),
                ("folder", r.folder),
                ("turn_id", r.turn_id.into_string()),
                ("state", r.state.to_string()),
                ("outcome", or_dash(r.outcome)),
                ("error", or_dash(r.error)),
                ("exit_code", or_dash(r.exit_code)),
                ("created_at", r.created_at),
                ("started_at", or_dash(r.started_at)),
                ("ended_at", or_dash(r.ended_at)),
            ] {
                println!("{k:<11} {v}");
            }
            println!("output:");
            r.outputs.iter().for_each(print_block);
        }
        RunsCommand::Kill { run } => {
            let r = d.call(runed::kill_run(&run), &token).await?;
            if json {
                print_json(&r);
            } else {
                println!("{}: {} ({})", r.run_id, r.state, or_dash(r.outcome));
            }
        }
        RunsCommand::Logs { run, follow } => {
            if !follow {
                let r = d.call(runed::run(&run), &token).await?;
                for b in &r.outputs {
                    if json {
                        print_json(b);
                    } else {
                        print_block(b);
                    }
                }
                return Ok(true);
            }
            let ok = d
                .run_events(&run, &token, |ev| match ev {
                    _ if json => print_json(ev),
                    RunStreamEvent::Output { block, .. } => block.iter().for_each(print_block),
                    RunStreamEvent::State { state, .. } => eprintln!("({state})"),
                })
                .await?;
            return Ok(ok);
        }
    }
    Ok(true)
}
