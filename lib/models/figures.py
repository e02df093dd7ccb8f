"""The models and serving stages' figures: the embedded models' training curves, the server's throughput.
"""
from __future__ import annotations

from lib.compendium.artifacts import read_json
from lib.models.embedded import curve_figure
from lib.compendium.params import load_profile
from lib.models.serving import throughput_figure
from lib.evaluation.figure_kit import art_path, figure


# ----------------------------------------------------------------------------- models, serving
@figure("models_training_curves", "stage models (lib.models.embedded)",
        ("models/memeworld-clip/training.json", "models/memeworld-vlm/training.json", "models/metrics.json"),
        "Training loss of the two embedded models, with their held-out figures", optional=True)
def draw_models_training_curves(profile: str):
    clip = read_json(art_path(profile, "models/memeworld-clip/training.json"))
    vlm = read_json(art_path(profile, "models/memeworld-vlm/training.json"))
    return curve_figure(clip["curve"], vlm["curve"], read_json(art_path(profile, "models/metrics.json")), profile)


@figure("serving_throughput", "stage serving (lib.models.serving)", ("serving/metrics.json",),
        "Completion tokens per second: llama.cpp server vs transformers, same GGUF")
def draw_serving_throughput(profile: str):
    preset = load_profile(profile).get("serving", {}).get("served_preset", "served model")
    return throughput_figure(read_json(art_path(profile, "serving/metrics.json")), preset)
