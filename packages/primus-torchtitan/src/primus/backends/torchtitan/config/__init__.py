"""TorchTitan's Trainer.Config from Primus params (`bridge`)."""
