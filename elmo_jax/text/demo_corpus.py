"""The built-in demo corpus: English-like sentences from a small grammar with a known entropy.

Each sentence draws a topic (uniform over money, river and music), a template (fixed
probabilities) and, for every slot of the template, a word from that slot's category (Zipfian
probabilities). Nouns, verbs and adjectives belong to a topic and are spelled from that topic's
syllables; some nouns ("bank", "current", "bass", ...) belong to two topics and so take two
senses, told apart only by their context. Names and places are shared by all topics. Every verb
and adjective belongs to exactly one topic, every template holds a verb or an adjective,
categories never share a word except those ambiguous nouns (always nouns in both topics), and no
two templates have the same category sequence. A sentence therefore determines its topic,
template and choices, so

    -log p(sentence) = log(n_topics) - log p(template) + sum over slots of -log p(word | category)

exactly, and the expected entropy per predicted token (n words + `</S>`, bilm-tf's count, the
same for the backward LM) is `E[H(sentence)] / E[n + 1]`: an exact number (`floor_perplexity`),
the best perplexity any language model can reach on this corpus in expectation.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math

import numpy as np

from elmo_jax.errors import UserError
from elmo_jax.text.corpus import InMemory

TOPIC_WORDS = {
    "money": (
        "money loan account credit interest cash fund tax budget debt price market investor trader coin wallet profit",
        "lends borrows invests saves pays owes spends withdraws trades",
        "wealthy costly cheap fiscal monetary financial rich",
    ),
    "river": (
        "river water shore boat fish stream mud reed willow heron canoe ferry flood delta bridge",
        "flows floods rows fishes drifts swims wades paddles",
        "muddy wet shallow deep swift grassy rocky",
    ),
    "music": (
        "song guitar drum melody chord choir band singer concert tune piano violin rhythm",
        "sings plays hums tunes composes performs records",
        "loud melodic harmonic acoustic musical quiet",
    ),
}

# Nouns with two senses: each is a noun of both topics.
AMBIGUOUS_NOUNS = {
    "bank": ("money", "river"),
    "current": ("river", "money"),
    "deposit": ("money", "river"),
    "branch": ("money", "river"),
    "bass": ("music", "river"),
    "note": ("music", "money"),
    "record": ("music", "money"),
    "scale": ("music", "river"),
}

# Disjoint letters per topic: a word's spelling tells its topic (the char CNN can read it).
TOPIC_SYLLABLES = {
    "money": "fex dak cuv kop dix fod cak vex duk fic kov dac",
    "river": "wal rul bli lor wob rib lun wil bor ril lob wur",
    "music": "mis sen nym sym mon sin nem mys sun nis meh syn",
}

SHARED_WORDS = {
    "DET": "the a this that every some each any",
    "TIME": (
        "yesterday today tomorrow tonight again often daily later soon weekly rarely nightly "
        "early recently sometimes always"
    ),
    "ADV": (
        "slowly quickly quietly happily badly well gladly boldly calmly gently proudly sadly "
        "eagerly loudly softly briskly"
    ),
}
NAME_SYLLABLES = "an na el li ro sa tom mar ben ka jo ed"
PLACE_SYLLABLES = "ber lin ham ford ton vil ash brook dale mont port wick"

# (probability, slots); a slot is a category (DET, ADJ, NOUN, VERB, NAME, PLACE, TIME, ADV) or a
# literal token. ADJ, NOUN and VERB come from the sentence's topic; a model that ignores the
# topic pays log(3) on each of them after the first.
TEMPLATES = (
    (0.20, "DET ADJ NOUN VERB ADV ."),
    (0.15, "NAME VERB DET ADJ NOUN in PLACE ."),
    (0.15, "DET NOUN VERB DET NOUN TIME ."),
    (0.10, "TIME , NAME and NAME VERB DET NOUN ."),
    (0.10, "NAME from PLACE VERB ADV ."),
    (0.15, "NAME met NAME at DET ADJ NOUN in PLACE ."),
    (0.15, "in PLACE , DET NOUN VERB NAME ."),
)
TOPIC_CATEGORIES = ("NOUN", "VERB", "ADJ")
SIZES = {"NOUN": 150, "VERB": 50, "ADJ": 50, "NAME": 1000, "PLACE": 800}
ZIPF_EXPONENTS = {"NAME": 0.3, "PLACE": 0.3}  # the other categories: 0.6
BLOCK = 1024  # sentences generated together from one seed


def _zipf(n: int, exponent: float) -> np.ndarray:
    p = 1.0 / np.arange(1, n + 1) ** exponent
    return p / p.sum()


def _entropy(p: np.ndarray) -> float:
    return float(-(p * np.log(p)).sum())


class DemoGrammar:
    """The fixed grammar (independent of any corpus seed): word lists and their probabilities."""

    def __init__(self):
        rng = np.random.default_rng(20180215)
        taken: set[str] = set()
        for words in SHARED_WORDS.values():
            taken.update(words.split())
        taken.update(AMBIGUOUS_NOUNS)
        taken.update(slot for _, slots in TEMPLATES for slot in slots.split())
        for nouns, verbs, adjectives in TOPIC_WORDS.values():
            taken.update((nouns + " " + verbs + " " + adjectives).split())

        def invent(syllables: list[str], suffix: str) -> str:
            while True:
                word = "".join(rng.choice(syllables, size=rng.integers(2, 4))) + suffix
                if word not in taken:
                    taken.add(word)
                    return word

        self.topics = list(TOPIC_WORDS)
        self.categories: dict[str, list[str]] = {}
        for topic, (nouns, verbs, adjectives) in TOPIC_WORDS.items():
            syllables = TOPIC_SYLLABLES[topic].split()
            ambiguous = [w for w, ts in AMBIGUOUS_NOUNS.items() if topic in ts]
            real = {"NOUN": ambiguous + nouns.split(), "VERB": verbs.split(), "ADJ": adjectives.split()}
            suffix = {"NOUN": "", "VERB": "s", "ADJ": "y"}
            for category in TOPIC_CATEGORIES:
                words = list(real[category])
                while len(words) < SIZES[category]:
                    words.append(invent(syllables, suffix[category]))
                self.categories[f"{category}:{topic}"] = words
        for category, words in SHARED_WORDS.items():
            self.categories[category] = words.split()
        for category, syllables in (("NAME", NAME_SYLLABLES), ("PLACE", PLACE_SYLLABLES)):
            self.categories[category] = [invent(syllables.split(), "").capitalize() for _ in range(SIZES[category])]
        self.templates = [slots.split() for _, slots in TEMPLATES]
        self.template_p = np.array([p for p, _ in TEMPLATES])
        self.word_p = {c: _zipf(len(ws), ZIPF_EXPONENTS.get(c, 0.6)) for c, ws in self.categories.items()}
        self.word_cdf = {c: np.cumsum(p) for c, p in self.word_p.items()}

    @property
    def words(self) -> list[str]:
        """Every distinct word the grammar can produce, literals included."""
        out = dict.fromkeys(w for ws in self.categories.values() for w in ws)
        out.update(dict.fromkeys(s for t in self.templates for s in t if not self._is_category(s)))
        return list(out)

    def _is_category(self, slot: str) -> bool:
        return slot in TOPIC_CATEGORIES or slot in self.categories

    def _category(self, slot: str, topic: str) -> str | None:
        if slot in TOPIC_CATEGORIES:
            return f"{slot}:{topic}"
        return slot if slot in self.categories else None

    def expected_entropy(self) -> tuple[float, float]:
        """(E[H(sentence)] in nats, E[predicted tokens per sentence] = E[n + 1])."""
        h = math.log(len(self.topics)) + _entropy(self.template_p)
        length = 0.0
        topic = self.topics[0]  # every topic's categories have the same sizes and probabilities
        for p, slots in zip(self.template_p, self.templates):
            for slot in slots:
                category = self._category(slot, topic)
                if category is not None:
                    h += p * _entropy(self.word_p[category])
            length += p * (len(slots) + 1)
        return h, length

    @property
    def floor_perplexity(self) -> float:
        """exp(entropy per predicted token): the best expected perplexity on this corpus."""
        h, length = self.expected_entropy()
        return math.exp(h / length)

    def parses(self, sentence: list[str]) -> list[float]:
        """log p(topic, template, words) of every way the grammar can produce `sentence`."""
        out = []
        for topic in self.topics:
            for p, slots in zip(self.template_p, self.templates):
                if len(slots) != len(sentence):
                    continue
                lp = math.log(p / len(self.topics))
                for slot, word in zip(slots, sentence):
                    category = self._category(slot, topic)
                    if category is None:
                        ok = slot == word
                    else:
                        words = self.categories[category]
                        ok = word in words
                        if ok:
                            lp += math.log(self.word_p[category][words.index(word)])
                    if not ok:
                        break
                else:
                    out.append(lp)
        return out

    def sample(self, rng: np.random.Generator, n: int) -> list[list[str]]:
        """n sentences drawn with `rng`."""
        topics = rng.integers(len(self.topics), size=n)
        templates = np.searchsorted(np.cumsum(self.template_p), rng.random(n) * self.template_p.sum())
        uniforms = rng.random((n, max(len(t) for t in self.templates)))
        out = []
        for i in range(n):
            topic = self.topics[topics[i]]
            sentence = []
            for j, slot in enumerate(self.templates[templates[i]]):
                category = self._category(slot, topic)
                if category is None:
                    sentence.append(slot)
                else:
                    k = int(np.searchsorted(self.word_cdf[category], uniforms[i, j] * self.word_cdf[category][-1]))
                    sentence.append(self.categories[category][k])
            out.append(sentence)
        return out


@functools.cache
def grammar() -> DemoGrammar:
    return DemoGrammar()


SPLITS = {"train": (0, 200_000), "heldout": (1, 5_000)}


class DemoCorpus(InMemory):
    """A fixed-size split of the demo corpus, sentence i generated on demand by index.

    Sentences come in blocks of BLOCK drawn from a generator seeded by (seed, split, block), so
    any sentence is reproducible without generating the ones before its block.
    """

    def __init__(self, split: str = "train", seed: int = 0, size: int | None = None):
        if split not in SPLITS:
            raise UserError(f"unknown demo split {split!r}; expected one of {sorted(SPLITS)}")
        self.split, (self.split_id, default_size) = split, SPLITS[split]
        self.size = default_size if size is None else size
        self.seed = seed
        self.name = f"demo:{split}"
        self.grammar = grammar()
        self._blocks: dict[int, list[list[str]]] = {}

    def __len__(self) -> int:
        return self.size

    @property
    def floor_perplexity(self) -> float:
        return self.grammar.floor_perplexity

    def first(self, n: int) -> DemoCorpus:
        """Its first n sentences."""
        return DemoCorpus(self.split, self.seed, min(n, self.size))

    def source_perplexity(self) -> float:
        """The grammar's own perplexity on these very sentences (n words + `</S>` predicted
        each): what a model that knew the grammar would score here, so no model can score much
        lower."""
        nats = tokens = 0.0
        for sentence in self.stream():
            nats -= float(np.logaddexp.reduce(self.grammar.parses(sentence)))
            tokens += len(sentence) + 1
        return math.exp(nats / tokens)

    def fingerprint(self) -> str:
        """From what makes the sentences (the grammar, the split, the seed, the size), without
        generating them."""
        g = self.grammar
        made_by = (
            g.templates,
            g.template_p.tolist(),
            sorted((c, ws, g.word_p[c].tolist()) for c, ws in g.categories.items()),
        )
        return hashlib.sha256(json.dumps([made_by, self.split_id, self.seed, self.size]).encode()).hexdigest()

    def _block(self, b: int) -> list[list[str]]:
        if b not in self._blocks:  # kept: the whole split is a few tens of MB
            rng = np.random.default_rng([self.seed, self.split_id, b])
            self._blocks[b] = self.grammar.sample(rng, BLOCK)
        return self._blocks[b]

    def __getitem__(self, i: int) -> list[str]:
        if not 0 <= i < self.size:
            raise IndexError(f"sentence {i} outside {self.name} of {self.size} sentences")
        return self._block(i // BLOCK)[i % BLOCK]
