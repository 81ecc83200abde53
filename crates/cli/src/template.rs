use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use bulkhead_images::{ImageCache, IndicatifProgress, LogProgress, Progress, TemplateRecipe};
use clap::Subcommand;

use crate::args::DataArgs;

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

/// The recipes named in a `--templates` list, in order, each once.
pub fn selected(names: &[String]) -> anyhow::Result<Vec<TemplateRecipe>> {
    let mut out: Vec<TemplateRecipe> = Vec::new();
    for name in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
        if !out.iter().any(|r| r.id == name) {
            out.push(builtin(name)?);
        }
    }
    if out.is_empty() {
        anyhow::bail!(
            "no template selected: pass --templates with some of: {}",
            TemplateRecipe::builtin_ids().join(", ")
        );
    }
    Ok(out)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selects_templates_in_order_once() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let ids = |r: Vec<TemplateRecipe>| r.into_iter().map(|r| r.id).collect::<Vec<_>>();
        assert_eq!(
            ids(selected(&names(&["base", " code-interpreter-v1", "base"])).unwrap()),
            ["base", "code-interpreter-v1"]
        );
        assert_eq!(ids(selected(&names(&["base", ""])).unwrap()), ["base"]);
        assert!(selected(&names(&[""])).is_err());
        let err = selected(&names(&["nope"])).unwrap_err().to_string();
        assert!(err.contains("code-interpreter-v1"), "{err}");
    }
}
