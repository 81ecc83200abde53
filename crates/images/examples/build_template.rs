//! Builds the `base` template into a cache and prints where it is.
//!
//! ```text
//! cargo run -p bulkhead-images --example build_template -- [--cache DIR] [--extra-ca PEM]
//!     [--debootstrap] [--install-tools] [--list]
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use bulkhead_images::{
    BootstrapTool, DEFAULT_CACHE_ROOT, ImageCache, TemplateRecipe, auto_progress,
};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let mut cache_root = PathBuf::from(DEFAULT_CACHE_ROOT);
    let mut recipe = TemplateRecipe::base();
    let mut tool = None;
    let mut install = false;
    let mut list = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--cache" => cache_root = args.next().expect("--cache DIR").into(),
            "--extra-ca" => {
                recipe = recipe.with_extra_ca_bundle(args.next().expect("--extra-ca PEM"))
            }
            "--debootstrap" => tool = Some(BootstrapTool::Debootstrap),
            "--install-tools" => install = true,
            "--list" => list = true,
            other => {
                eprintln!("unknown argument {other:?}");
                return ExitCode::FAILURE;
            }
        }
    }
    let mut cache = ImageCache::new(cache_root).install_missing_tools(install);
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
    let progress = auto_progress();
    match cache.build(&recipe, progress.as_ref()).await {
        Ok(path) => {
            println!("{}", path.display());
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
