"""Vision-language models: decoded request images and the models that read them."""
