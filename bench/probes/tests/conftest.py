"""The suite's tokenizer and tiny-model fixtures (tests/fixtures/, on the path through pytest's
`pythonpath`), for the probes' tests that serve or load a model folder."""

from fixtures import model_fixtures

qwen3_tokenizer_dir = model_fixtures.qwen3_tokenizer_dir
tiny_model = model_fixtures.tiny_model
