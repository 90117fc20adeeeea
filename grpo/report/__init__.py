"""What a run reports: metric sinks, metrics.jsonl, curves, sampled episodes, the summary and dashboards."""
