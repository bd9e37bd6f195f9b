"""Image parts of the three wire formats, in the form chat templates of vision models expect:
each image becomes `{"type": "image"}` in its place in the content list (text parts kept), and
that placeholder carries its image (checked, decoded on first use), so the images travel with
the messages, in order, through every conversion and copy, and `images_of` decodes them."""

from typing import Any

from ..model.vision.media import MediaImage
from .errors import bad_request
from .media import DEFAULT_POLICY, MediaReader, PendingImage

# mlx_lm.server's spellings of an OpenAI image part (its `_image_url`)
OPENAI_IMAGE_TYPES = ("image_url", "input_image", "image")


class ImagePart(dict):
    """`{"type": "image"}` as the template sees it; `.pending` is its image."""

    def __init__(self, pending: PendingImage) -> None:
        super().__init__(type="image")
        self.pending = pending

    def __deepcopy__(self, memo: dict) -> "ImagePart":
        return ImagePart(self.pending)  # one image, decoded once, however often copied

    def __copy__(self) -> "ImagePart":
        return ImagePart(self.pending)


def openai_image_url(part: dict[str, Any]) -> Any:
    """The URL of an OpenAI-style image part (`image_url: {url}` or a bare string, under
    `image_url` or `image`), as mlx_lm.server reads it."""
    url = part.get("image_url", part.get("image"))
    return url.get("url") if isinstance(url, dict) else url


def openai_image(part: dict[str, Any], where: str, reader: MediaReader) -> ImagePart:
    field = "image_url" if "image_url" in part else "image"
    value = part.get(field)
    if isinstance(value, dict) and not isinstance(value.get("detail"), str | None):
        raise bad_request(f"{where}.{field}.detail must be a string", reader.param)
    return ImagePart(reader.url(openai_image_url(part), f"{where}.{field}"))


def images_of(messages: list[dict[str, Any]]) -> tuple[MediaImage, ...]:
    """The decoded images of `messages`, in the order the template meets them (each
    decoded here on first use: a bad one is a 400 naming its part)."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            out.extend(p.pending.get() for p in content if isinstance(p, ImagePart))
    return tuple(out)


def has_images(content: Any) -> bool:
    return isinstance(content, list) and any(isinstance(p, ImagePart) for p in content)


def user_only(role: Any, where: str, param: str) -> None:
    if role != "user":
        raise bad_request(f"{where}: images are taken in user messages only", param)


def first_image_at(body: dict[str, Any]) -> str | None:
    """Where the body's first image part is (chat and Anthropic `messages`, Responses
    `input`), without decoding anything: a model that takes no images refuses the request
    by this alone."""
    for key, kinds in (("messages", OPENAI_IMAGE_TYPES), ("input", ("input_image",))):
        items = body.get(key)
        if not isinstance(items, list):
            continue
        for i, item in enumerate(items):
            content = item.get("content") if isinstance(item, dict) else None
            if not isinstance(content, list):
                continue
            for j, part in enumerate(content):
                if isinstance(part, dict) and part.get("type") in kinds:
                    if "source" in part:  # an Anthropic block: its errors' dotted style
                        return f"{key}.{i}.content.{j}"
                    return f"{key}[{i}].content[{j}]"
    return None


def refuse_images(model: str, takes_images: bool, where: str | None) -> None:
    """A 400 naming the first image part when the served model takes no images."""
    if where is not None and not takes_images:
        param = where.replace("[", ".").split(".", 1)[0]
        why = "images are not supported by a text-only model"
        raise bad_request(f"{where}: model {model} does not take images ({why})", param)


def chat_content(content: list, i: int, role: Any, reader: MediaReader | None) -> str | list:
    """An OpenAI chat content list: its text parts joined (mlx-lm's process_message_content),
    or, where it holds images, the list of text parts and image placeholders in order."""
    parts: list[dict[str, Any]] = []
    images = False
    for j, part in enumerate(content):
        where = f"messages[{i}].content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if isinstance(part, ImagePart):  # read already (Responses' input_image)
            parts.append(part)
            images = True
        elif kind == "text":
            if not isinstance(part.get("text"), str):
                raise bad_request(f"messages[{i}]: a text part needs a string 'text'", "messages")
            parts.append({"type": "text", "text": part["text"]})
        elif kind in OPENAI_IMAGE_TYPES:
            user_only(role, where, "messages")
            reader = reader or MediaReader(DEFAULT_POLICY)
            parts.append(openai_image(part, where, reader))
            images = True
        else:
            raise bad_request(
                f"{where}: content part {kind!r} is not supported (text and image parts are)",
                "messages",
            )
    return parts if images else "".join(p["text"] for p in parts)
