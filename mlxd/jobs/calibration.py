"""Calibration text for measuring quantization sensitivity: a local file, or a short mixed text
(prose, dialogue, code, numbers) kept in the package so a job never downloads anything."""

from pathlib import Path

import mlx.core as mx

EMBEDDED = """\
The river left its banks in early spring, and the village moved its market to the hill.
Traders set up under canvas, and by noon the square smelled of bread, smoke and wet wool.
An old ferryman counted the boats that had drifted loose: three skiffs, a barge and a door.

"Can you read the gauge from here?" she asked.
"Barely. It says four metres and rising, but the paint is peeling."
"Then we wait until the morning and check it again."

Photosynthesis turns light, water and carbon dioxide into sugar and oxygen. Chlorophyll
absorbs red and blue light and reflects green, which is why most leaves look green to us.
In autumn the chlorophyll breaks down first, and the yellow and orange pigments show through.

def moving_average(values: list[float], window: int) -> list[float]:
    if window <= 0:
        raise ValueError("window must be positive")
    total, out = 0.0, []
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out

SELECT city, COUNT(*) AS orders, SUM(amount) AS revenue
FROM sales WHERE created_at >= '2021-01-01'
GROUP BY city ORDER BY revenue DESC LIMIT 10;

To solve 3x + 7 = 22, subtract 7 from both sides to get 3x = 15, then divide by 3: x = 5.
The area of a circle of radius r is pi * r^2, so a radius of 2 cm gives about 12.57 cm^2.
Prime numbers below fifty: 2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43 and 47.

Le train de nuit part à vingt-deux heures et arrive à Vienne le lendemain matin.
Der Bericht wurde gestern veröffentlicht und enthält drei Empfehlungen für den Stadtrat.
El museo abre de martes a domingo; la entrada es gratuita el primer sábado del mes.

User: Summarise the meeting notes in two sentences.
Assistant: The team agreed to ship the release on Thursday after fixing the login bug. Marta
will update the documentation, and the next review is scheduled for the following Monday.
"""


def calibration_text(path: str | None) -> str:
    if path is None:
        return EMBEDDED
    return Path(path).read_text(encoding="utf-8", errors="replace")


def calibration_tokens(tokenizer, path: str | None, n_tokens: int) -> mx.array:
    """The first `n_tokens` token ids of the text, as a (1, n) batch; the embedded text is
    repeated when a tokenizer packs it into fewer ids."""
    text = calibration_text(path)
    ids = list(tokenizer.encode(text))
    if not ids:
        raise ValueError("calibration: the text has no tokens")
    while len(ids) < n_tokens and path is None:
        ids += list(tokenizer.encode("\n" + text))
    return mx.array(ids[:n_tokens])[None]
