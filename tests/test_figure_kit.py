"""lib.evaluation.figure_kit: images shown in figures."""
import matplotlib

matplotlib.use("Agg")


def test_an_image_named_through_a_folder_that_is_not_there_is_shown(tmp_path):
    """FOIL's records name their images as memeworld/foil/../img/<id>.png; a fresh clone's `make reproduce NB=07`
    restores the committed image alone (no foil/ folder), so the path is resolved lexically, not by the OS."""
    import matplotlib.pyplot as plt
    import numpy as np
    from PIL import Image
    from lib.evaluation.figure_kit import show_image
    (tmp_path / "memeworld" / "img").mkdir(parents=True)
    Image.fromarray(np.full((4, 6, 3), 200, np.uint8)).save(tmp_path / "memeworld" / "img" / "1.png")
    fig, ax = plt.subplots()
    show_image(ax, tmp_path / "memeworld" / "foil" / ".." / "img" / "1.png")
    assert ax.images[0].get_array().shape[:2] == (4, 6)
    plt.close(fig)
