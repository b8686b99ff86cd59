"""Lightning callbacks and the metrics they log (isotropy, IR effectiveness, TREC run files)."""
