"""Accessibility checks run inside the page: labels, accessible names, text contrast.

Contrast follows WCAG 2.x: relative luminance of sRGB colours, ratio (L1 + 0.05) / (L2 + 0.05),
at least 4.5:1 for text. The page reports each visible text element's computed colour and
its effective background (the nearest ancestor with an opaque background colour); the ratio
is computed here.
"""

from __future__ import annotations

import re
from typing import Any

MIN_CONTRAST = 4.5

UNLABELLED_CONTROLS = """() => [...document.querySelectorAll('input, select, textarea')]
  .filter((el) => el.type !== 'hidden' && el.getClientRects().length)
  .filter((el) => {
    const byFor = el.id && document.querySelector(`label[for="${CSS.escape(el.id)}"]`);
    return !(byFor || el.closest('label') || el.getAttribute('aria-label')
      || el.getAttribute('aria-labelledby'));
  })
  .map((el) => el.outerHTML.slice(0, 120))"""

NAMELESS_BUTTONS = """() => [...document.querySelectorAll('button, [role=button]')]
  .filter((el) => el.getClientRects().length)
  .filter((el) => !(el.textContent.trim() || el.getAttribute('aria-label')
      || el.getAttribute('title')))
  .map((el) => el.outerHTML.slice(0, 120))"""

TEXT_COLOURS = """() => {
  const out = [];
  const bgOf = (el) => {
    for (let e = el; e; e = e.parentElement) {
      const bg = getComputedStyle(e).backgroundColor;
      const m = bg.match(/rgba?\\(([^)]+)\\)/);
      if (m) {
        const parts = m[1].split(',').map(Number);
        if (parts.length < 4 || parts[3] > 0.5) return bg;
      }
    }
    return 'rgb(255, 255, 255)';
  };
  for (const el of document.querySelectorAll('body *')) {
    if (el.closest('svg, .toast, .visually-hidden, [hidden]')) continue;
    const own = [...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
    if (!own || !el.getClientRects().length) continue;
    const r = el.getBoundingClientRect();
    if (r.right < 0 || r.bottom < 0) continue;
    const cs = getComputedStyle(el);
    if (cs.visibility === 'hidden' || cs.opacity === '0') continue;
    out.push({ tag: el.tagName.toLowerCase(), cls: el.className || '',
      text: el.textContent.trim().slice(0, 40), color: cs.color, bg: bgOf(el) });
    if (out.length > 600) break;
  }
  return out;
}"""


def _rgb(css: str) -> tuple[float, float, float]:
    nums = [float(x) for x in re.findall(r"[\d.]+", css)[:3]]
    return nums[0], nums[1], nums[2]


def luminance(css: str) -> float:
    def channel(c: float) -> float:
        c /= 255.0
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(c) for c in _rgb(css))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(fg: str, bg: str) -> float:
    a, b = sorted((luminance(fg), luminance(bg)), reverse=True)
    return (a + 0.05) / (b + 0.05)


def check_page(page: Any, where: str) -> int:
    """Assert labels, button names and text contrast on the page; returns elements checked."""
    unlabelled = page.evaluate(UNLABELLED_CONTROLS)
    assert not unlabelled, f"{where}: form controls without a label: {unlabelled}"
    nameless = page.evaluate(NAMELESS_BUTTONS)
    assert not nameless, f"{where}: buttons without an accessible name: {nameless}"
    texts = page.evaluate(TEXT_COLOURS)
    low = [
        (
            t["text"],
            t["tag"],
            t["cls"],
            t["color"],
            t["bg"],
            round(contrast(t["color"], t["bg"]), 2),
        )
        for t in texts
        if contrast(t["color"], t["bg"]) < MIN_CONTRAST
    ]
    assert not low, f"{where}: text below {MIN_CONTRAST}:1 contrast: {low[:10]}"
    return len(texts)
