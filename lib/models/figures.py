"""The models and serving stages' figures: the embedded models' training curves, the server's throughput.
"""
from __future__ import annotations

from lib.compendium.artifacts import read_json
from lib.models.embedded import curve_figure
from lib.models.serving import throughput_figure
from lib.evaluation.figure_kit import art_path, figure, needs


# ----------------------------------------------------------------------------- models, serving
@figure("models_training_curves", "stage models (lib.models.embedded)",
        (needs("model_training", model="memeworld-clip"), needs("model_training", model="memeworld-vlm"), "models_metrics"),
        "Training loss of the two embedded models, with their held-out figures", optional=True)
def draw_models_training_curves(profile: str):
    clip = read_json(art_path(profile, "model_training", model="memeworld-clip"))
    vlm = read_json(art_path(profile, "model_training", model="memeworld-vlm"))
    return curve_figure(clip["curve"], vlm["curve"], read_json(art_path(profile, "models_metrics")), profile)


@figure("serving_throughput", "stage serving (lib.models.serving)", ("serving_metrics",),
        "Completion tokens per second: llama.cpp server vs transformers, same GGUF")
def draw_serving_throughput(profile: str):
    preset = read_json(art_path(profile, "serving_settings")).get("served_preset", "served model") \
        if art_path(profile, "serving_settings").exists() else "served model"
    return throughput_figure(read_json(art_path(profile, "serving_metrics")), preset)
