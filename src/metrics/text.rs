//! The Prometheus text format 0.0.4, made from the OpenMetrics text the registry writes.

/// OpenMetrics text as the Prometheus text format 0.0.4. The samples are written the same;
/// what differs is the metadata: a counter family is named with its `_total` in `# HELP` and
/// `# TYPE` (OpenMetrics names it without), and there is no `# UNIT` nor `# EOF`.
pub(super) fn prometheus_text(open: &str) -> String {
    let counters: std::collections::HashSet<&str> = open
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(open.len() + 16 * counters.len());
    for line in open.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        // (no family of ours is `unknown`, `info` or `stateset`; 0.0.4 would call the first
        // `untyped` and has no others)
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|tag| Some((tag, line.strip_prefix(tag)?)));
        match meta {
            Some((tag, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                out.push_str(tag);
                out.push_str(name);
                if counters.contains(name) {
                    out.push_str("_total");
                }
                if !tail.is_empty() {
                    out.push(' ');
                    out.push_str(tail);
                }
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}
