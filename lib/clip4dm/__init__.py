"""CLIP4DM: unsupported caption words from negative gradient attributions in CLIP's text encoder,
F-CLIPScore and the misalignment benchmarks (method), and its cached runs and reports (report)."""
