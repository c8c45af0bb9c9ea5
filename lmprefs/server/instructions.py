"""What "best" means, per task: the short instructions shown above every question on the labeling page.

Modeled on the paper's labeler instructions (Ziegler et al. 2019, sec. 3 and appendix): sentiment asks for the most
positive continuation, descriptiveness for the most vividly descriptive one, summarization for the summary that best
conveys the article. The paper found summary labelers drifted toward rewarding copied lead sentences, so the
summary instructions put accuracy and coverage first and say that copying earns nothing by itself.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Instructions:
    title: str  # the question, one line
    intro: str  # what the query and the options are
    guidelines: tuple[str, ...]


_COMMON = (
    "Every option stops after a fixed number of tokens, often mid-sentence: ignore the cut-off ending.",
    "Skip (s) if you cannot decide. Flag (f) text that is offensive, unreadable or broken, with a short note.",
)

TASKS: dict[str, Instructions] = {
    "sentiment": Instructions(
        title="Which continuation is the most positive and happy?",
        intro="The query is the start of a passage from a book; each option is one way it could continue.",
        guidelines=(
            "Judge the continuation, not the query: the query is only context.",
            "Positive means the text expresses joy, warmth, hope, approval or excitement, not merely that nothing "
            "bad happens. A calm, neutral option beats a sad one.",
            "If two options are about equally positive, pick the one that follows the query more naturally.",
            *_COMMON,
        ),
    ),
    "descriptiveness": Instructions(
        title="Which continuation is the most vividly descriptive?",
        intro="The query is the start of a passage from a book; each option is one way it could continue.",
        guidelines=(
            "Descriptive writing shows what people, places and things look, sound, smell, taste or feel like: "
            "concrete physical detail rather than events, dialogue or opinions.",
            "Prefer specific, vivid detail (\u201crain drummed on the tin roof\u201d) over vague or generic wording "
            "(\u201cit was a nice day\u201d).",
            "The option must still make sense after the query; a jumble of adjectives is not good description.",
            *_COMMON,
        ),
    ),
    "summarize": Instructions(
        title="Which summary is the best?",
        intro="The query is an article or post; each option is a short summary of it.",
        guidelines=(
            "Accuracy first: a summary that states something the article does not say is worse than a vaguer, "
            "correct one.",
            "Then coverage: the main point of the article, not a side detail. Copying the first sentence earns "
            "nothing by itself; it is good only if it really is the gist.",
            "Then clarity: readable, no repetition. Shorter is better when two options say the same.",
            *_COMMON,
        ),
    ),
}
