"""MaxText's config from Primus params (`bridge`), and MaxText driven as a library: its config
errors raised, absl's flags parsed."""
