//! `hako routes`: which chats go to which group.

use hako_client::routd;
use hako_shared::GroupFolder;
use hako_shared::chat::NewRoute;

use super::{OpsArgs, emit, print_json};

/// `hako routes …`.
#[derive(Debug, clap::Args)]
pub struct RoutesArgs {
    #[command(subcommand)]
    pub command: RoutesCommand,
    #[command(flatten)]
    pub ops: OpsArgs,
}

/// What to do with routes (routd).
#[derive(Debug, clap::Subcommand)]
pub enum RoutesCommand {
    /// The rules, in order.
    List,
    /// A rule: chats whose JID matches `pattern` (exact or glob) go to `folder`.
    #[command(
        after_help = "Examples:\n  hako routes add 'tg:-100*' team/dev\n  hako routes add web:lobby lobby --position 0"
    )]
    Add {
        /// A JID or a glob (`*`, `?`).
        pattern: String,
        /// The group folder.
        folder: String,
        /// Its place in the order (default: last).
        #[arg(long)]
        position: Option<i64>,
    },
    /// Remove a rule by id.
    Rm {
        /// The rule's id (`hako routes list`).
        id: i64,
    },
}

/// `hako routes`.
pub async fn routes(args: RoutesArgs) -> anyhow::Result<bool> {
    let d = args.ops.daemons()?;
    let token = d.operator_token().await?;
    let json = args.ops.json;
    match args.command {
        RoutesCommand::List => {
            let list = d.call(routd::routes(), &token).await?;
            if json {
                print_json(&list);
                return Ok(true);
            }
            println!("{:<6} {:<9} {:<28} folder", "id", "position", "pattern");
            for r in &list.routes {
                println!(
                    "{:<6} {:<9} {:<28} {}",
                    r.id, r.position, r.pattern, r.folder
                );
            }
        }
        RoutesCommand::Add {
            pattern,
            folder,
            position,
        } => {
            let folder =
                GroupFolder::new(&folder).map_err(|e| anyhow::anyhow!("folder {folder:?}: {e}"))?;
            let route = NewRoute {
                pattern,
                folder,
                position,
            };
            let r = d.call(routd::add_route(&route), &token).await?;
            if json {
                print_json(&r);
            } else {
                println!("route {}: {} -> {}", r.id, r.pattern, r.folder);
            }
        }
        RoutesCommand::Rm { id } => {
            let r = d.call(routd::delete_route(id), &token).await?;
            emit(json, &r, |r| {
                println!("route {id} removed: {} -> {}", r.pattern, r.folder);
            });
        }
    }
    Ok(true)
}
