"""Tables that fit the terminal: like ``squeue`` and ``nvitop``, readable at 80 to 120 columns.

Rich shrinks every column of a table that is too wide for the terminal a little, so at 100
columns ``gpupool queue`` had lost its job ids, states and times (``… NAME NODELIST(REASON)``)
and ``gpupool gpus`` its node and index while it kept a 40-character UUID. A
:class:`FitTable` is laid out for the width it is printed at instead, by **moves** applied in
order until the table fits:

- :class:`Drop` removes a column (the least useful first: a start estimate, a UUID);
- :class:`Cut` narrows a column down to a floor, its values ending in ``…``.

Columns no move names (a job id, its state, time and slice; a GPU's node and index) are never
cut. The last move of a table is usually the cut of its free-text column (the pending reason),
so that is cut last. When every move is spent the table is printed as it is (rich folds it).
Through a pipe a table is printed at its natural width, at least 400 columns
(:func:`gpupool.cli.session.emit`), so scripts always get every column, whole, however long
a pending reason is.

Columns are separated by two spaces (:data:`GAP`); headers are bold; a cell may be a rich
``Text`` (colour), measured by its plain text.

Plain text (a pipe, ``--no-color`` golden files) is written by :meth:`FitTable.plain` directly,
character for character what rich prints for the same table: rich's table renderer took about
2 ms a row, so ``gpupool queue`` with 5,000 jobs spent most of its 8 s laying out the table.
A table that does not fit even after every move, or has a title, is still left to rich.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

TYPE_CHECKING = False
if TYPE_CHECKING:  # rich is imported where a table is left to it, never to print plain text
    from rich.console import Console, ConsoleOptions, RenderResult
    from rich.measure import Measurement
    from rich.table import Table
    from rich.text import Text

    Cell = str | Text

#: Spaces between two columns.
GAP = 2


class Drop:
    """Remove the column ``name`` when the table does not fit."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Drop({self.name!r})"


class Cut:
    """Narrow the column ``name``, down to ``floor`` characters, when the table does not fit.

    (Plain classes, not dataclasses: ``gpupool queue`` builds its table without importing
    :mod:`dataclasses`, see :mod:`gpupool.cli.hot`.)"""

    __slots__ = ("floor", "name")

    def __init__(self, name: str, floor: int) -> None:
        self.name = name
        self.floor = floor

    def __repr__(self) -> str:
        return f"Cut({self.name!r}, {self.floor})"


Move = Drop | Cut

#: What rich would read as markup in a text cell: a style tag (``[b]``, not ``[3]``) or an
#: emoji code (``:+1:``; ``:00:`` in a time is not one). Rich's emoji names with no letter in
#: them are listed, so that a cell is handed to rich only when rich could change it.
_TAG = re.compile(r"\[[a-z#/@][^[]*?]")
_EMOJI = re.compile(r"(:(\S*?)(?:(?:\-)(emoji|text))?:)")
_EMOJI_WITHOUT_LETTERS = frozenset({"+1", "-1", "100", "1234", "__1"})


def cell_len(text: str) -> int:
    """Columns ``text`` takes in a terminal (rich's measure; ASCII without importing it)."""
    if text.isascii():
        return len(text)
    from rich.cells import cell_len as rich_cell_len  # wide characters only

    return rich_cell_len(text)


def set_cell_size(text: str, width: int) -> str:
    """``text`` cut or padded to ``width`` columns, as rich does it."""
    if text.isascii():
        return text[:width].ljust(width)
    from rich.cells import set_cell_size as rich_set  # wide characters only

    return rich_set(text, width)


def _is_plain(cell: str) -> bool:
    """Whether rich prints ``cell`` as it is (no style tag, no emoji code in it)."""
    if "[" in cell and _TAG.search(cell):
        return False
    if ":" in cell:
        for match in _EMOJI.finditer(cell):
            name = match.group(2).lower()
            if name in _EMOJI_WITHOUT_LETTERS or any(c.isalpha() for c in name):
                return False
    return True


def _as_rich_prints(cell: str) -> str | None:
    """A text cell as rich shows it: rich reads a table's text cells as markup with emoji
    codes (``[b]`` is a style, ``:x:`` an emoji), so the plain text must too; ``None`` for a
    cell rich cannot read (it is left to rich, which says why)."""
    if _is_plain(cell):
        return cell
    from rich.errors import MarkupError  # a cell rich would change
    from rich.text import Text

    try:
        return Text.from_markup(cell).plain
    except MarkupError:
        return None


class FitTable:
    """A table laid out for the width it is printed at (see the module docstring)."""

    def __init__(
        self,
        columns: Sequence[str],
        *,
        right: Sequence[str] = (),
        moves: Sequence[Move] = (),
        title: str | None = None,
    ) -> None:
        self.columns = list(columns)
        self.right = set(right)
        self.moves = list(moves)
        self.title = title
        self.rows: list[list[Cell]] = []
        unknown = {m.name for m in self.moves} - set(self.columns)
        if unknown:
            raise ValueError(f"moves name columns the table does not have: {sorted(unknown)}")

    def add_row(self, *cells: Cell) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(list(cells))

    def natural_widths(self) -> dict[str, int]:
        """Each column's width with nothing cut: its widest cell or its header."""
        widths = {name: len(name) for name in self.columns}
        for row in self.rows:
            for name, cell in zip(self.columns, row, strict=True):
                width = cell_len(cell) if isinstance(cell, str) else cell.cell_len
                widths[name] = max(widths[name], width)
        return widths

    def natural_width(self) -> int:
        """The width the table takes with nothing cut (a pipe prints it so, however wide)."""
        return sum(self.natural_widths().values()) + GAP * (len(self.columns) - 1)

    def widths_for(self, width: int) -> dict[str, int]:
        """The columns kept at ``width`` and how wide each is, after the moves it takes."""
        natural = self.natural_widths()
        widths = dict(natural)

        def total() -> int:
            return sum(widths.values()) + GAP * (len(widths) - 1)

        cut: list[str] = []
        for move in self.moves:
            excess = total() - width
            if excess <= 0:
                break
            if move.name not in widths:
                continue
            if isinstance(move, Drop):
                del widths[move.name]
            else:
                widths[move.name] -= min(excess, max(0, widths[move.name] - move.floor))
                cut.append(move.name)
        # A later drop may have freed more than it needed: the cut columns get it back, the
        # first cut first (a long reason cut early to make room is shown whole again).
        for name in dict.fromkeys(cut):
            spare = width - total()
            if spare <= 0:
                break
            if name in widths:
                widths[name] += min(spare, natural[name] - widths[name])
        return widths

    def layout(self, width: int) -> Table:
        """The rich table for a console ``width`` columns wide."""
        from rich import box  # rich lays this table out
        from rich.table import Table

        widths = self.widths_for(width)
        table = Table(
            box=box.SIMPLE_HEAD,
            show_edge=False,
            pad_edge=False,
            padding=(0, GAP - 1, 0, 0),
            title=self.title,
            title_justify="left",
            header_style="bold",
        )
        kept = [i for i, name in enumerate(self.columns) if name in widths]
        for i in kept:
            name = self.columns[i]
            table.add_column(
                name,
                justify="right" if name in self.right else "left",
                no_wrap=True,
                overflow="ellipsis",
                width=widths[name],
            )
        for row in self.rows:
            table.add_row(*(row[i] for i in kept))
        return table

    def plain(self, width: int) -> str | None:
        """The table as rich prints it without colour at ``width``, each line's trailing spaces
        removed; ``None`` when only rich can lay it out (a title, a cell over two lines, or
        wider than ``width`` after every move)."""
        if self.title is not None:
            return None
        widths = self.widths_for(width)
        kept = [i for i, name in enumerate(self.columns) if name in widths]
        # the columns and their gaps (rich pads no edge, so the last column has no gap)
        if sum(widths[self.columns[i]] for i in kept) + GAP * (len(kept) - 1) > width:
            return None

        def line(cells: Sequence[Cell]) -> str | None:
            out = []
            for i in kept:
                cell = cells[i]
                text = _as_rich_prints(cell) if isinstance(cell, str) else cell.plain
                if text is None or "\n" in text:
                    return None
                name = self.columns[i]
                w = widths[name]
                if name in self.right:
                    text = text.rstrip()  # as rich justifies right: trailing spaces go first
                if cell_len(text) > w:
                    text = set_cell_size(text, w - 1) + "…" if w > 0 else ""
                pad = " " * (w - cell_len(text))
                out.append(pad + text if name in self.right else text + pad)
            return (" " * GAP).join(out).rstrip()

        head = line(self.columns)
        if head is None:
            return None
        total = sum(widths[self.columns[i]] for i in kept) + GAP * (len(kept) - 1)
        lines = [head, "─" * total]
        for row in self.rows:
            text = line(row)
            if text is None:
                return None
            lines.append(text)
        return "\n".join(lines) + "\n"

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.layout(options.max_width)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        from rich.measure import Measurement  # rich is printing it

        widths = self.widths_for(options.max_width)
        need = sum(widths.values()) + GAP * (len(widths) - 1)
        return Measurement(min(need, options.max_width), min(need, options.max_width))
