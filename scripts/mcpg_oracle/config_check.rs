//! `mcpg-config-check FILE...`: mcpg's own verdict on config files, one JSON line per file.
//!
//! Written for mcpipe's oracle (it is not part of mcpg). Each file goes through what mcpg does to a
//! config before it serves it, stage by stage, and the first refusal is reported:
//!
//! 1. `config`: `AppConfig::load_from_yaml_strs` (figment merge over the defaults, then `validate`),
//!    exactly what `mcpg config check FILE` runs (mcpg-config's src/check.rs);
//! 2. `schema_refs`: `resolve_schema_refs` against the file's folder, as `mcpg` does at boot;
//! 3. `license_gate`: `license_gate::enforce_plugin_license_gate`, which the gateway runs at boot
//!    before any plugin loads (its tests list configs it refuses).
//!
//! Prints `{"file", "accepted", "stage", "message", "causes", "warnings"}`; `message` is the error as
//! `mcpg config check` prints it, `causes` its `caused by:` lines.
use std::path::Path;

fn refusal(stage: &str, e: &anyhow::Error) -> serde_json::Value {
    let causes: Vec<String> = e.chain().skip(1).map(|c| c.to_string()).collect();
    serde_json::json!({"accepted": false, "stage": stage, "message": e.to_string(), "causes": causes})
}

async fn verdict(path: &Path) -> serde_json::Value {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) => return refusal("read", &anyhow::anyhow!("reading {}: {e}", path.display())),
    };
    let mut config = match mcpg::config::AppConfig::load_from_yaml_strs(&[text.as_str()]) {
        Ok(config) => config,
        Err(e) => return refusal("config", &e),
    };
    let warnings: Vec<String> = mcpg::config::unreachable_trust_bindings(&config)
        .into_iter()
        .map(|b| format!("unreachable trust floor on {b}"))
        .collect();
    if let Err(e) = config.resolve_schema_refs(path.parent()).await {
        return refusal("schema_refs", &e);
    }
    if let Err(e) = mcpg::license_gate::enforce_plugin_license_gate(&config) {
        return refusal("license_gate", &e);
    }
    serde_json::json!({"accepted": true, "stage": "", "message": "", "causes": [], "warnings": warnings})
}

#[tokio::main]
async fn main() {
    mcpg::transports::tls::install_default_crypto_provider();
    for file in std::env::args().skip(1) {
        let mut line = verdict(Path::new(&file)).await;
        line["file"] = serde_json::Value::String(file);
        println!("{line}");
    }
}
