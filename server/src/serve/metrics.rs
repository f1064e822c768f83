//! What /metrics reports: the engine's counters and gauges, plus what the server measures per
//! request (outcomes, HTTP statuses, token counts, time to first token, inter-token latency),
//! in Prometheus' text format. Beside kiln's own names, the gauges a router reads from a model
//! server by vLLM's names (`vllm:num_requests_waiting`, `vllm:num_requests_running`,
//! `vllm:kv_cache_usage_perc`, `vllm:cache_config_info`), labelled with the served model as
//! vLLM labels them, so vllm-router and llm-d's endpoint picker read kiln as they read vLLM.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

use kiln_core::engine::Snapshot;

/// Bucket bounds in seconds, for both latency histograms.
const BOUNDS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A Prometheus histogram with fixed buckets.
#[derive(Clone, Debug, Default)]
pub struct Histogram {
    /// Observations at or below each bound (not cumulative; summed when rendered).
    counts: [u64; BOUNDS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    pub fn observe(&mut self, v: f64) {
        if let Some(i) = BOUNDS.iter().position(|&b| v <= b) {
            self.counts[i] += 1;
        }
        self.count += 1;
        self.sum += v;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut acc = 0;
        for (b, c) in BOUNDS.iter().zip(&self.counts) {
            acc += c;
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {acc}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

/// The server's own measurements.
#[derive(Debug, Default)]
pub struct Counters {
    /// Finished choices by outcome: stop, length, tool_calls, error, cancelled.
    pub finished: BTreeMap<&'static str, u64>,
    /// Responses by HTTP status.
    pub http: BTreeMap<u16, u64>,
    pub prompt_tokens: u64,
    pub generated_tokens: u64,
    pub ttft: Histogram,
    pub itl: Histogram,
    /// Chat-template renders by outcome: ok, error (the template failed), fuel, output,
    /// memory, time (a limit), cancelled (the client left), sandbox (the sandbox failed).
    pub renders: BTreeMap<&'static str, u64>,
    /// Renders running now.
    pub renders_active: u64,
    pub render_seconds: Histogram,
}

#[derive(Debug, Default)]
pub struct Metrics(Mutex<Counters>);

impl Metrics {
    /// Runs `f` on the counters (a poisoned lock is taken over: counters stay usable).
    pub fn with(&self, f: impl FnOnce(&mut Counters)) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g);
    }

    /// The whole /metrics page of a server of `model`.
    pub fn render(&self, s: &Snapshot, model: &str) -> String {
        let mut out = String::new();
        render_vllm(&mut out, s, model);
        let gauges: [(&str, &str, f64); 9] = [
            (
                "kiln_requests_waiting",
                "Requests queued.",
                s.waiting as f64,
            ),
            (
                "kiln_requests_running",
                "Requests resident in the KV cache.",
                s.running as f64,
            ),
            (
                "kiln_kv_blocks_free",
                "Free KV cache blocks (cached ones included).",
                s.kv_free as f64,
            ),
            (
                "kiln_kv_blocks_used",
                "KV cache blocks held by requests.",
                s.kv_total.saturating_sub(s.kv_free) as f64,
            ),
            (
                "kiln_kv_blocks_cached",
                "KV cache blocks registered in the prefix cache (held or free).",
                s.kv_cached as f64,
            ),
            (
                "kiln_state_snapshots",
                "Recurrent-state snapshots held for prefix caching.",
                s.state_snapshots as f64,
            ),
            (
                "kiln_state_snapshot_bytes",
                "Memory the recurrent-state snapshots take.",
                (s.state_snapshots * s.state_snapshot_bytes) as f64,
            ),
            (
                "kiln_state_snapshot_budget_bytes",
                "Memory the recurrent-state snapshots may take.",
                (s.state_snapshots_max * s.state_snapshot_bytes) as f64,
            ),
            (
                "kiln_prefix_cache_hit_rate",
                "Prompt tokens served from the prefix cache over tokens looked up.",
                if s.stats.prefix_queried_tokens == 0 {
                    0.0
                } else {
                    s.stats.prefix_hit_tokens as f64 / s.stats.prefix_queried_tokens as f64
                },
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        let g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let counters: [(&str, &str, u64); 17] = [
            ("kiln_kv_blocks_total", "Usable KV cache blocks in all.", s.kv_total as u64),
            ("kiln_engine_steps_total", "Forward passes.", s.stats.steps),
            (
                "kiln_tokens_computed_total",
                "Tokens run through the model (prefill, decode, recomputation).",
                s.stats.tokens_computed,
            ),
            (
                "kiln_prompt_tokens_total",
                "Prompt tokens of finished requests.",
                g.prompt_tokens,
            ),
            (
                "kiln_generation_tokens_total",
                "Tokens generated for finished requests.",
                g.generated_tokens,
            ),
            (
                "kiln_preemptions_total",
                "Requests preempted for KV space.",
                s.stats.preemptions,
            ),
            (
                "kiln_prefix_cache_hit_tokens_total",
                "Prompt tokens whose K/V came from the prefix cache.",
                s.stats.prefix_hit_tokens,
            ),
            (
                "kiln_prefix_cache_queried_tokens_total",
                "Prompt tokens looked up in the prefix cache.",
                s.stats.prefix_queried_tokens,
            ),
            (
                "kiln_diffusion_canvases_total",
                "Canvases a diffusion model committed.",
                s.stats.canvases,
            ),
            (
                "kiln_diffusion_denoising_steps_total",
                "Denoising steps of a diffusion model (steps per canvas: this over canvases).",
                s.stats.denoising_steps,
            ),
            (
                "kiln_diffusion_passes_total",
                "Forward passes that denoised canvases.",
                s.stats.diffusion_passes,
            ),
            (
                "kiln_diffusion_pass_canvases_total",
                "Canvases those passes denoised (canvases per pass: this over the passes).",
                s.stats.diffusion_pass_canvases,
            ),
            (
                "kiln_diffusion_shared_passes_total",
                "Passes that denoised canvases beside other requests' tokens (prompt chunks, committed canvases, token-by-token generation).",
                s.stats.diffusion_shared_passes,
            ),
            (
                "kiln_spec_verifications_total",
                "Speculative decoding: a request's drafts scored by the target (one per request per step).",
                s.stats.spec.verifications,
            ),
            (
                "kiln_spec_draft_tokens_total",
                "Speculative decoding: tokens drafted.",
                s.stats.spec.drafted,
            ),
            (
                "kiln_spec_accepted_tokens_total",
                "Speculative decoding: drafted tokens the target accepted (acceptance rate: this over drafted).",
                s.stats.spec.accepted,
            ),
            (
                "kiln_engine_cancelled_total",
                "Requests the engine dropped before their end (the client left, or a stop string matched).",
                s.stats.cancelled,
            ),
        ];
        for (name, help, v) in counters {
            let kind = if name == "kiln_kv_blocks_total" {
                "gauge"
            } else {
                "counter"
            };
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        }
        out.push_str("# HELP kiln_spec_accept_length_total Speculative verifications by how many drafts they accepted.\n# TYPE kiln_spec_accept_length_total counter\n");
        for (n, c) in s.stats.spec.accept_lengths.iter().enumerate() {
            let _ = writeln!(out, "kiln_spec_accept_length_total{{accepted=\"{n}\"}} {c}");
        }
        out.push_str("# HELP kiln_requests_total Finished choices by outcome.\n# TYPE kiln_requests_total counter\n");
        for (status, n) in &g.finished {
            let _ = writeln!(out, "kiln_requests_total{{status=\"{status}\"}} {n}");
        }
        out.push_str("# HELP kiln_http_responses_total Responses by HTTP status.\n# TYPE kiln_http_responses_total counter\n");
        for (code, n) in &g.http {
            let _ = writeln!(out, "kiln_http_responses_total{{code=\"{code}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "# HELP kiln_template_renders_active Chat-template renders running now.\n# TYPE kiln_template_renders_active gauge\nkiln_template_renders_active {}",
            g.renders_active
        );
        out.push_str("# HELP kiln_template_renders_total Chat-template renders by outcome (ok, error, a limit: fuel, output, memory, time; cancelled; sandbox).\n# TYPE kiln_template_renders_total counter\n");
        for (outcome, n) in &g.renders {
            let _ = writeln!(
                out,
                "kiln_template_renders_total{{outcome=\"{outcome}\"}} {n}"
            );
        }
        g.render_seconds.render(
            &mut out,
            "kiln_template_render_seconds",
            "Time to render a request's chat template (in the sandbox).",
        );
        g.ttft.render(
            &mut out,
            "kiln_time_to_first_token_seconds",
            "From a request's arrival to its first token.",
        );
        g.itl.render(
            &mut out,
            "kiln_inter_token_latency_seconds",
            "Between consecutive tokens of a request.",
        );
        out.push_str("# HELP kiln_cpu_fallbacks_total Ops run on the CPU reference because the backend lacks them.\n# TYPE kiln_cpu_fallbacks_total counter\n");
        for (backend, op, n) in &s.fallbacks {
            let _ = writeln!(
                out,
                "kiln_cpu_fallbacks_total{{backend=\"{backend}\",op=\"{op}\"}} {n}"
            );
        }
        out
    }
}

/// A Prometheus label value: backslash, double quote and newline escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The fraction of the KV pool requests hold (cached blocks no request holds count as free,
/// as vLLM counts its evictable ones): 0 when idle, 1 when full.
pub fn kv_usage(s: &Snapshot) -> f64 {
    if s.kv_total == 0 {
        return 0.0;
    }
    s.kv_total.saturating_sub(s.kv_free) as f64 / s.kv_total as f64
}

/// The gauges by vLLM's names (the model-server protocol of llm-d's endpoint picker and
/// vllm-router's load-aware policies).
fn render_vllm(out: &mut String, s: &Snapshot, model: &str) {
    let m = label(model);
    let gauges: [(&str, &str, f64); 4] = [
        (
            "vllm:num_requests_running",
            "Requests in the running batch (resident in the KV cache).",
            s.running as f64,
        ),
        (
            "vllm:num_requests_waiting",
            "Requests waiting to be scheduled.",
            s.waiting as f64,
        ),
        (
            "vllm:kv_cache_usage_perc",
            "KV cache usage: 1 means every block is held.",
            kv_usage(s),
        ),
        (
            "vllm:gpu_cache_usage_perc",
            "The same under vLLM's earlier name (what older endpoint pickers read).",
            kv_usage(s),
        ),
    ];
    for (name, help, v) in gauges {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{model_name=\"{m}\"}} {v}"
        );
    }
    let _ = writeln!(
        out,
        "# HELP vllm:cache_config_info Information of the KV cache configuration.\n# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{{block_size=\"{}\",num_gpu_blocks=\"{}\",model_name=\"{m}\"}} 1",
        s.kv_block_size, s.kv_total
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vLLM-named gauges of a snapshot, with a model name that needs escaping (a label
    /// value is written as Prometheus reads it back).
    #[test]
    fn vllm_gauges_render_with_an_escaped_model_label() {
        let s = Snapshot {
            waiting: 3,
            running: 2,
            kv_free: 30,
            kv_total: 40,
            kv_block_size: 16,
            ..Snapshot::default()
        };
        let out = Metrics::default().render(&s, "a\"b\\c\nd");
        let m = "model_name=\"a\\\"b\\\\c\\nd\"";
        for line in [
            format!("vllm:num_requests_running{{{m}}} 2"),
            format!("vllm:num_requests_waiting{{{m}}} 3"),
            format!("vllm:kv_cache_usage_perc{{{m}}} 0.25"),
            format!("vllm:cache_config_info{{block_size=\"16\",num_gpu_blocks=\"40\",{m}}} 1"),
        ] {
            assert!(out.lines().any(|l| l == line), "{line} not in\n{out}");
        }
        assert!(!out.contains("b\\c\nd"), "a raw newline in a label");
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let mut h = Histogram::default();
        for v in [0.001, 0.02, 0.02, 0.3, 100.0] {
            h.observe(v);
        }
        let mut out = String::new();
        h.render(&mut out, "x", "help");
        assert!(out.contains("x_bucket{le=\"0.005\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"0.025\"} 3\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"0.5\"} 4\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"30\"} 4\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 5\n"), "{out}");
        assert!(out.contains("x_count 5\n"), "{out}");
        assert!(out.contains("x_sum 100.341"), "{out}");
    }
}
