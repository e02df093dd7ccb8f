"""ARCADE on H-VLI: the prosecutor / defender / judge court with its gated dual track (court), and
its evaluation per interaction type and difficulty (report)."""
