"""Experiment grids: `python experiments.py grid=NAME [key=value ...]` over `configs/grid/NAME.yaml`.

`engine` plans, runs and collects the cells (each a `train.py` / `evaluate.py` run of pipeline), `spec` loads and
checks the grid file, `cells` handles cell claims and cells files, `tables` renders the papers' tables with
significance tests, `record` writes a dated results record. The grid sits above pipeline and uses its public API
only (`pipeline.config`, `pipeline.run`, `pipeline.cli`).
"""
