use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use bulkhead_images::{ImageCache, IndicatifProgress, LogProgress, Progress, TemplateRecipe};
use clap::Subcommand;

use crate::DataArgs;

#[derive(Subcommand)]
pub enum TemplateCmd {
    /// Build a template's root filesystem (cached by content hash).
    Build {
        #[arg(default_value = "base")]
        name: String,
        /// Extra CA bundle to trust inside the template.
        #[arg(long, env = "BULKHEAD_EXTRA_CA_BUNDLE")]
        extra_ca_bundle: Option<PathBuf>,
    },
    /// List cached template images.
    Ls,
}

pub async fn run(data: DataArgs, cmd: TemplateCmd) -> anyhow::Result<ExitCode> {
    let cache = ImageCache::new(data.image_cache()).install_missing_tools(true);
    match cmd {
        TemplateCmd::Build {
            name,
            extra_ca_bundle,
        } => {
            let mut recipe = match name.as_str() {
                "base" => TemplateRecipe::base(),
                other => {
                    anyhow::bail!("unknown template {other:?}: the built-in templates are: base")
                }
            };
            recipe.extra_ca_bundle = extra_ca_bundle;
            let path = ensure_built(&cache, &recipe).await?;
            println!("{} {} {}", recipe.id, recipe.content_hash(), path.display());
        }
        TemplateCmd::Ls => {
            println!("{:<66} {:>10}", "CONTENT HASH", "SIZE");
            for img in cache.list()? {
                println!("{:<66} {:>10}", img.hash, human(img.size_bytes));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Build the template unless cached, showing progress (a spinner on a terminal, plain lines
/// otherwise).
pub async fn ensure_built(cache: &ImageCache, recipe: &TemplateRecipe) -> anyhow::Result<PathBuf> {
    if cache.is_ready(recipe) {
        return Ok(cache.rootfs_path(recipe));
    }
    eprintln!(
        "Building template '{}' ({}); this happens once and takes about a minute…",
        recipe.id,
        &recipe.content_hash()[..12]
    );
    let progress: Box<dyn Progress> = if std::io::stderr().is_terminal() {
        Box::new(IndicatifProgress::new())
    } else {
        Box::new(LogProgress::default())
    };
    Ok(cache.build(recipe, progress.as_ref()).await?)
}

fn human(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}
