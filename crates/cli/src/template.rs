//! `bulkhead template`: build and list template images, and the progress-reporting build step
//! `serve` runs before it starts the server.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use bulkhead_images::{ImageCache, IndicatifProgress, LogProgress, Progress, TemplateRecipe};
use clap::Subcommand;

use bulkhead_cli::args::DataArgs;

#[derive(Subcommand)]
pub enum TemplateCmd {
    /// Build a template's root filesystem (cached by content hash).
    Build {
        /// base or code-interpreter-v1.
        #[arg(default_value = "base")]
        name: String,
        /// Extra CA bundle to trust inside the template.
        #[arg(long, env = "BULKHEAD_EXTRA_CA_BUNDLE")]
        extra_ca_bundle: Option<PathBuf>,
    },
    /// List cached template images.
    Ls,
    /// Pull an image from an OCI registry into the cache (e.g. `python:3.12`), so templates
    /// built from it start without a download. Prints the content hash and the tree's path.
    Pull {
        /// Image reference: `name[:tag]`, `registry/name[:tag]` or `name@sha256:…`.
        reference: String,
        #[command(flatten)]
        registry: crate::registryargs::RegistryArgs,
    },
}

pub async fn run(data: DataArgs, cmd: TemplateCmd) -> anyhow::Result<ExitCode> {
    let cache = ImageCache::new(data.image_cache()).install_missing_tools(true);
    match cmd {
        TemplateCmd::Build {
            name,
            extra_ca_bundle,
        } => {
            let mut recipe = builtin(&name)?;
            recipe.extra_ca_bundle = extra_ca_bundle;
            let path = ensure_built(&cache, &recipe).await?;
            println!("{} {} {}", recipe.id, recipe.content_hash(), path.display());
        }
        TemplateCmd::Pull {
            reference,
            registry,
        } => {
            let config = registry.config()?;
            let image = cache
                .pull_image(&reference, &config, None, progress().as_ref())
                .await?;
            println!(
                "{} {} {}",
                image.reference,
                image.hash,
                image.rootfs.display()
            );
        }
        TemplateCmd::Ls => {
            println!(
                "{:<22} {:<66} {:>10} {:>7}",
                "TEMPLATE", "CONTENT HASH", "SIZE", "STATE"
            );
            for img in cache.list()? {
                let id = img.info.as_ref().map_or("-", |i| i.recipe.id.as_str());
                let state = if img.ready { "ready" } else { "partial" };
                println!(
                    "{:<22} {:<66} {:>10} {:>7}",
                    id,
                    img.hash,
                    human(img.size_bytes),
                    state
                );
            }
            let wanted: Vec<String> = TemplateRecipe::builtin_ids()
                .iter()
                .filter_map(|id| TemplateRecipe::builtin(id))
                .filter(|r| !cache.is_ready(r))
                .map(|r| r.id)
                .collect();
            if !wanted.is_empty() {
                println!("not built yet: {}", wanted.join(", "));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The built-in recipe called `name`.
pub fn builtin(name: &str) -> anyhow::Result<TemplateRecipe> {
    TemplateRecipe::builtin(name).ok_or_else(|| {
        anyhow::anyhow!(
            "unknown template {name:?}: the built-in templates are: {}",
            TemplateRecipe::builtin_ids().join(", ")
        )
    })
}

/// Build the template unless cached, showing progress (a spinner on a terminal, plain lines
/// otherwise).
pub async fn ensure_built(cache: &ImageCache, recipe: &TemplateRecipe) -> anyhow::Result<PathBuf> {
    if cache.is_ready(recipe) {
        return Ok(cache.rootfs_path(recipe));
    }
    eprintln!(
        "Building template '{}' ({}); this happens once and takes {}…",
        recipe.id,
        &recipe.content_hash()[..12],
        if recipe.parent.is_some() {
            "a few minutes"
        } else {
            "about a minute"
        }
    );
    Ok(cache.build(recipe, progress().as_ref()).await?)
}

/// A spinner on a terminal, plain lines otherwise.
fn progress() -> Box<dyn Progress> {
    if std::io::stderr().is_terminal() {
        Box::new(IndicatifProgress::new())
    } else {
        Box::new(LogProgress::default())
    }
}

fn human(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}
