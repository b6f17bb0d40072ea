"""The built-in demo corpus: English-like sentences from a small grammar with a known entropy.

Each sentence draws a topic (uniform over the topics), a template (fixed probabilities) and,
for every slot of the template, a word from that slot's category (Zipfian probabilities). Nouns,
verbs and adjectives belong to a topic and are spelled from that topic's syllables; some nouns
("bank", "bass", "pitch", ...) belong to two topics and so take two senses, told apart only by
their context. Every verb and adjective belongs to exactly one topic, every template holds a
verb, categories never share a word except those ambiguous nouns (always nouns in both topics),
and no two templates have the same category sequence. A sentence therefore determines its topic,
template and choices, so

    -log p(sentence) = log(n_topics) - log p(template) + sum over slots of -log p(word | category)

exactly, and the expected entropy per predicted token (n words + `</S>`, bilm-tf's count, the
same for the backward LM) is `E[H(sentence)] / E[n + 1]`: an exact number (`floor_perplexity`),
the best perplexity any language model can reach on this corpus in expectation.
"""

from __future__ import annotations

import functools
import math

import numpy as np

TOPIC_WORDS = {
    "money": (
        "money loan account credit interest cash deposit fund tax budget debt price market "
        "investor trader coin wallet profit",
        "lends borrows invests saves deposits pays owes spends withdraws trades",
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
    "sport": (
        "ball goal team player coach match game referee stadium racket score",
        "kicks throws catches scores runs wins loses trains",
        "fast athletic fit strong tired winning",
    ),
    "kitchen": (
        "soup bread knife oven pan spoon plate salt pepper onion butter sauce flour",
        "cooks bakes stirs fries chops boils tastes",
        "hot spicy salty sweet fresh crispy",
    ),
    "garden": (
        "flower seed soil rose tree leaf root weed hedge lawn tulip shovel",
        "grows plants waters digs prunes blooms",
        "green leafy sunny blooming fertile",
    ),
}

# Nouns with two senses: each is a noun of both topics.
AMBIGUOUS_NOUNS = {
    "bank": ("money", "river"),
    "bass": ("music", "river"),
    "pitch": ("music", "sport"),
    "note": ("music", "money"),
    "stock": ("money", "kitchen"),
    "bowl": ("kitchen", "sport"),
    "scale": ("music", "kitchen"),
    "bed": ("garden", "river"),
    "record": ("music", "sport"),
    "spring": ("garden", "river"),
    "current": ("river", "money"),
}

TOPIC_SYLLABLES = {
    "money": "fin cred val mon ex port lar dex cor tal ban quo",
    "river": "wa ril bro lu mer sil fen bay mo rin del lo",
    "music": "so la mi ton ly cor ri dan fa mel sy no",
    "sport": "ka ro bal tor spi gan ju dex ra vic po tri",
    "kitchen": "sa pi cru bak zes to mar ga lic fro che su",
    "garden": "flo ver bu ro ga sem pe li ar bo thy mu",
}

SHARED_WORDS = {
    "DET": "the a this that every some each any",
    "PREP": "near with under beside behind across over past around along inside below",
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

# (probability, slots); a slot is a category (DET, ADJ, NOUN, VERB, PREP, NAME, TIME, ADV) or a
# literal token. ADJ, NOUN and VERB come from the sentence's topic.
TEMPLATES = (
    (0.20, "DET ADJ NOUN VERB DET NOUN PREP DET NOUN ."),
    (0.15, "NAME VERB DET NOUN TIME ."),
    (0.15, "DET NOUN VERB DET ADJ NOUN ."),
    (0.10, "TIME , NAME VERB DET NOUN PREP DET ADJ NOUN ."),
    (0.10, "DET NOUN PREP DET NOUN VERB ADV ."),
    (0.10, "NAME and NAME VERB DET NOUN ."),
    (0.10, "DET ADJ NOUN VERB ADV PREP DET NOUN ."),
    (0.10, "NAME VERB DET ADJ NOUN and DET NOUN ."),
)
TOPIC_CATEGORIES = ("NOUN", "VERB", "ADJ")
SIZES = {"NOUN": 300, "VERB": 100, "ADJ": 100, "NAME": 150}
ZIPF_EXPONENT = 0.8
BLOCK = 1024  # sentences generated together from one seed


def _zipf(n: int) -> np.ndarray:
    p = 1.0 / np.arange(1, n + 1) ** ZIPF_EXPONENT
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
        names = NAME_SYLLABLES.split()
        self.categories["NAME"] = [invent(names, "").capitalize() for _ in range(SIZES["NAME"])]
        self.templates = [slots.split() for _, slots in TEMPLATES]
        self.template_p = np.array([p for p, _ in TEMPLATES])
        self.word_p = {c: _zipf(len(ws)) for c, ws in self.categories.items()}
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

    def log_prob(self, sentence: list[str]) -> float:
        """log p(sentence) under the grammar."""
        return float(np.logaddexp.reduce(self.parses(sentence))) if self.parses(sentence) else -math.inf

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


class DemoCorpus:
    """A fixed-size split of the demo corpus, sentence i generated on demand by index.

    Sentences come in blocks of BLOCK drawn from a generator seeded by (seed, split, block), so
    any sentence is reproducible without generating the ones before its block.
    """

    def __init__(self, split: str = "train", seed: int = 0, size: int | None = None):
        if split not in SPLITS:
            raise ValueError(f"unknown demo split {split!r}; expected one of {sorted(SPLITS)}")
        self.split_id, default_size = SPLITS[split]
        self.size = default_size if size is None else size
        self.seed = seed
        self.name = f"demo:{split}"
        self.grammar = grammar()
        self._blocks: dict[int, list[list[str]]] = {}

    def __len__(self) -> int:
        return self.size

    def _block(self, b: int) -> list[list[str]]:
        if b not in self._blocks:  # kept: the whole split is a few tens of MB
            rng = np.random.default_rng([self.seed, self.split_id, b])
            self._blocks[b] = self.grammar.sample(rng, BLOCK)
        return self._blocks[b]

    def __getitem__(self, i: int) -> list[str]:
        if not 0 <= i < self.size:
            raise IndexError(f"sentence {i} outside {self.name} of {self.size} sentences")
        return self._block(i // BLOCK)[i % BLOCK]
