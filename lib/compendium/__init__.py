"""The compendium's own machinery: artifacts and their manifests, parameter profiles and their
schemas, model presets, prompts, the stage runner, committed results, the report and the cost tables."""
