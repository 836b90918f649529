"""`harness plan`: will a learner step fit in GPU memory? An estimate before any download.

- `architecture`: a model's shape from its Hugging Face config.json, and parameter counts;
- `setup`: what a step's memory depends on besides the model (`LearnerSetup`), byte sizes;
- `activations`: what autograd saves per token and block, and a no-grad block's working set;
- `memory`: bytes per GPU of one learner step, pure functions of a shape and a `LearnerSetup`;
- `plan`: an experiment config's arms to setups, the verdict and the options that would fit;
- `render`: the command's lines and table.
"""
