"""`harness plan`: will a learner step fit in GPU memory? An estimate before any download.

- `architecture`: a model's shape from its Hugging Face config.json, and parameter counts;
- `memory`: bytes per GPU of one learner step, pure functions of a shape and a `LearnerSetup`;
- `plan`: an experiment config's arms to setups, the verdict and the options that would fit;
- `render`: the command's lines and table.
"""
