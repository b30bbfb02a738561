"""The training layer: the one training loop, its streams, monitors and controller, unlearning runs and relearn
attackers."""
