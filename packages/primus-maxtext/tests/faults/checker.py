"""Test only: `python checker.py FOLDER...` opens each folder of saver.py's checkpoints as
MaxText's resume does (create_orbax_checkpoint_manager, latest_step), loads that step and prints
one JSON line per folder: the step picked and whether every value in it is that step."""

import json
import sys

import jax
import numpy as np
from maxtext.common import checkpointing


def main(folders: list[str]) -> None:
    for folder in folders:
        manager = checkpointing.create_orbax_checkpoint_manager(folder, True, True, 1)
        step = checkpointing.latest_step(manager)
        items = manager.load_checkpointables(step)["items"] if step is not None else {}
        leaves = [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(items)]
        whole = bool(leaves) and all(np.all(leaf == step) for leaf in leaves)
        print(json.dumps({"folder": folder, "step": step, "whole": whole}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
