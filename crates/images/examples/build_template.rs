//! Builds a built-in template (default `base`; also `code-interpreter-v1`) into a cache and
//! prints its hash and where it is.
//!
//! ```text
//! cargo run -p bulkhead-images --example build_template -- [--template ID] [--cache DIR]
//!     [--extra-ca PEM] [--no-build-ca] [--debootstrap] [--install-tools] [--verbose] [--list]
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use bulkhead_images::{
    BootstrapTool, DEFAULT_CACHE_ROOT, ImageCache, LogProgress, Progress, TemplateRecipe,
    auto_progress,
};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let mut cache_root = PathBuf::from(DEFAULT_CACHE_ROOT);
    let mut template = "base".to_owned();
    let mut extra_ca = None;
    let mut build_ca = true;
    let mut verbose = false;
    let mut tool = None;
    let mut install = false;
    let mut list = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--cache" => cache_root = args.next().expect("--cache DIR").into(),
            "--template" => template = args.next().expect("--template ID"),
            "--extra-ca" => extra_ca = Some(args.next().expect("--extra-ca PEM")),
            "--no-build-ca" => build_ca = false,
            "--verbose" => verbose = true,
            "--debootstrap" => tool = Some(BootstrapTool::Debootstrap),
            "--install-tools" => install = true,
            "--list" => list = true,
            other => {
                eprintln!("unknown argument {other:?}");
                return ExitCode::FAILURE;
            }
        }
    }
    let Some(mut recipe) = TemplateRecipe::builtin(&template) else {
        eprintln!(
            "unknown template {template:?}; built-in: {}",
            TemplateRecipe::builtin_ids().join(", ")
        );
        return ExitCode::FAILURE;
    };
    if let Some(ca) = extra_ca {
        recipe = recipe.with_extra_ca_bundle(ca);
    }
    let mut cache = ImageCache::new(cache_root).install_missing_tools(install);
    if !build_ca {
        cache = cache.with_build_ca_bundle(None);
    }
    if let Some(t) = tool {
        cache = cache.with_tool(t);
    }
    if list {
        for img in cache.list().expect("list the cache") {
            println!(
                "{} {:>8.1} MB {}",
                img.hash,
                img.size_bytes as f64 / 1e6,
                if img.ready { "ready" } else { "incomplete" }
            );
        }
        return ExitCode::SUCCESS;
    }
    let progress: Box<dyn Progress> = if verbose {
        Box::new(LogProgress::new())
    } else {
        auto_progress()
    };
    match cache.build(&recipe, progress.as_ref()).await {
        Ok(path) => {
            println!("{} {} {}", recipe.id, recipe.content_hash(), path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            // Print the whole chain once.
            let mut msg = format!("error: {e}");
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg.push_str(&format!("\n  caused by: {s}"));
                src = s.source();
            }
            eprintln!("{msg}");
            ExitCode::FAILURE
        }
    }
}
