//! `hako-images`: builds hako's images (static binaries, `FROM scratch`), skipping any whose
//! content hash already has an image.

use anyhow::Context;
use clap::{Parser, Subcommand};
use hako_deploy::progress::Progress;
use hako_deploy::{IMAGES, Pipeline, TEST_IMAGES, connect_docker};

#[derive(Parser)]
#[command(name = "hako-images", version, about = "Build hako's container images")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build images (all by default) unless an image of the same content hash exists.
    Build {
        /// Image names, e.g. hako-agent.
        names: Vec<String>,
        /// Rebuild even if an image with the same content hash exists.
        #[arg(long)]
        force: bool,
        /// Also the images only the tests use (CI builds everything before the tests, so
        /// that no test's time bound is spent compiling).
        #[arg(long)]
        tests: bool,
    },
    /// Print each image's hashed tag, without building.
    Tags,
    /// Remove images of older content hashes.
    Prune,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    hako_shared::telemetry::init()?;
    let cli = Cli::parse();
    let pipeline = Pipeline::new(connect_docker()?);
    match cli.command {
        Command::Build {
            names,
            force,
            tests,
        } => {
            let specs = if names.is_empty() {
                let mut all = IMAGES.to_vec();
                if tests {
                    all.extend_from_slice(TEST_IMAGES);
                }
                all
            } else {
                names
                    .iter()
                    .map(|n| Pipeline::spec(n))
                    .collect::<Result<_, _>>()?
            };
            let progress = Progress::stderr();
            for spec in specs {
                let tag = if force {
                    let hash = pipeline.content_hash(&spec)?;
                    pipeline.build(&spec, &hash).await?;
                    format!("{}:{hash}", spec.name)
                } else {
                    pipeline
                        .ensure_with(&spec, &|step| progress.report(spec.name, step))
                        .await?
                };
                println!("{tag}");
            }
        }
        Command::Tags => {
            for spec in IMAGES {
                println!("{}", pipeline.tag(spec)?);
            }
        }
        Command::Prune => {
            for spec in IMAGES {
                let hash = pipeline.content_hash(spec)?;
                let n = pipeline
                    .prune(spec, &hash)
                    .await
                    .with_context(|| format!("pruning {}", spec.name))?;
                println!("{}: removed {n} old image(s)", spec.name);
            }
        }
    }
    Ok(())
}
