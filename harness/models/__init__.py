"""Models: the model factory, the tokenizer, warm start and greedy evaluation of a policy."""
