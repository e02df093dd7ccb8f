"""Datasets in their real formats (FHM, MultiOFF, H-VLI, MAMI, FOIL, HAT, RichHF, SeeTRUE, ...),
MemeWorld (the generated benchmark), meme rendering, prompt-injection copies and stage 00's preparation."""
