"""Stop strings on streamed text: OpenAI's `stop`, matched on the decoded output.

The text before the first stop string is the output; the stop string and what follows are
dropped. "First" is the earliest point at which some stop string is complete; when several
end there, the longest (the one that starts earliest) cuts. While streaming, a tail that
could still be the start of a stop string is held back until the next delta decides it, so
no client ever sees text that is later cut.

Matching runs on the event loop, once per token batch of every choice, so its cost must not
grow with the number of stop strings: one Aho-Corasick automaton per request (`StopSet`,
built once, shared by its choices) and one state per choice (`StopStrings`). Each new
character costs O(1) amortised whatever the set; the automaton's state is also the length
of the held-back tail (the longest suffix of the text that begins some stop string).

    StopSet(("abc", "bd"))         trie nodes, failure links, longest match ending at each
    StopStrings(stop_set).add(t)   the text that may be released now
"""

from __future__ import annotations


class StopSet:
    """An immutable Aho-Corasick automaton over the non-empty stop strings."""

    def __init__(self, stop: tuple[str, ...]) -> None:
        # Node 0 is the root (the empty string); node n stands for one prefix of a stop string.
        self._next: list[dict[str, int]] = [{}]
        self._fail: list[int] = [0]
        self.depth: list[int] = [0]  # length of node n's prefix = characters held back there
        self.match: list[int] = [0]  # longest stop string ending at node n (0: none)
        for s in stop:
            if s:
                self._insert(s)
        self._link()

    def __bool__(self) -> bool:
        return len(self._next) > 1

    def _insert(self, s: str) -> None:
        node = 0
        for ch in s:
            child = self._next[node].get(ch)
            if child is None:
                child = len(self._next)
                self._next[node][ch] = child
                self._next.append({})
                self._fail.append(0)
                self.depth.append(self.depth[node] + 1)
                self.match.append(0)
            node = child
        self.match[node] = len(s)

    def _link(self) -> None:
        """Failure links breadth first: a node's link is the longest proper suffix of its
        prefix that is itself a prefix, so its parent's link is always ready before it."""
        queue = list(self._next[0].values())
        for node in queue:
            for ch, child in self._next[node].items():
                fail = self._fail[node]
                while fail and ch not in self._next[fail]:
                    fail = self._fail[fail]
                link = self._next[fail].get(ch, 0)
                self._fail[child] = link if link != child else 0
                self.match[child] = max(self.match[child], self.match[self._fail[child]])
                queue.append(child)

    def step(self, node: int, ch: str) -> int:
        while node and ch not in self._next[node]:
            node = self._fail[node]
        return self._next[node].get(ch, 0)


class StopStrings:
    """One choice's position in a StopSet; `stopped` once a stop string has appeared."""

    def __init__(self, stop_set: StopSet) -> None:
        self._set = stop_set
        self._node = 0
        self._pending = ""  # text received but not yet released: the automaton's last depth chars
        self.stopped = False

    def add(self, text: str) -> str:
        """The text that may be released now; after a match, `stopped` is True."""
        if self.stopped:
            return ""
        if not self._set:
            return text
        pending = self._pending + text
        base = len(self._pending)  # pending[base + i] is text[i]
        node, stop_set = self._node, self._set
        for i, ch in enumerate(text):
            node = stop_set.step(node, ch)
            length = stop_set.match[node]
            if length:
                self.stopped = True
                self._pending = ""
                return pending[: base + i + 1 - length]
        self._node = node
        keep = stop_set.depth[node]
        out = pending[: len(pending) - keep]
        self._pending = pending[len(out) :]
        return out

    def flush(self) -> str:
        """The end of the output: what was held back was no stop string after all."""
        out, self._pending = self._pending, ""
        return "" if self.stopped else out
