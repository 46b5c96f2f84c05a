// Reads JSON lines {"json": <text>} or {"schema": <schema>, "instance": <value>} on stdin and prints, per
// line, serde_json's parse error of the text (null when it parses) or the jsonschema crate's errors of the
// instance, as mcpg's argument check formats them.
use std::io::BufRead;

fn main() {
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let req: serde_json::Value = serde_json::from_str(&line).unwrap();
        if let Some(text) = req.get("json").and_then(|v| v.as_str()) {
            let out = match serde_json::from_str::<serde_json::Value>(text) {
                Ok(_) => serde_json::Value::Null,
                Err(e) => serde_json::Value::String(e.to_string()),
            };
            println!("{}", out);
        } else {
            let validator = jsonschema::options().build(&req["schema"]).unwrap();
            let errors: Vec<String> = validator
                .iter_errors(&req["instance"])
                .map(|e| {
                    if e.instance_path.as_str().is_empty() {
                        e.to_string()
                    } else {
                        format!("{}: {}", e.instance_path, e)
                    }
                })
                .collect();
            println!("{}", serde_json::Value::from(errors));
        }
    }
}
