"""The prompts of bench_speculative.py: input-grounded tasks (rewrite, quote-extract, JSON
extraction under a schema, an agent loop re-reading tool results) and free chat.

Passages are filled from templates with a seeded generator, so every prompt of a batch is
distinct (identical prompts would share their outputs through the radix tree and flatter
speculation). Each prompt is a chat (list of messages) for the instruct model's template.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

NAMES = ["Maria Lopez", "James Carter", "Aiko Tanaka", "Samuel Okafor", "Lena Fischer",
         "Omar Haddad", "Grace Kim", "Pedro Alves", "Nina Petrova", "Tom Wright"]
STREETS = ["Maple Street", "Cedar Road", "Hill Lane", "Station Avenue", "Park Road",
           "Church Street", "River Walk", "Mill Lane"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
COLORS = ["forest green", "slate gray", "orange", "navy blue", "red", "black", "sand"]
PRODUCTS = ["Trailmate", "Ridgeline", "Summit", "Pathfinder", "Northwind", "Canyon"]
RIVERS = ["Silver River", "Ash River", "Wren River", "Colne", "Black Water"]
TOWNS = ["Elmford", "Brackley", "Oakham", "Whitby", "Marlow", "Fenwick", "Holt"]
TEAM = ["Anna", "Ben", "Chen", "Dara", "Eli", "Farah", "Gus", "Hana"]


def outage_notice(rng: random.Random) -> tuple[str, dict]:
    f = {"name": rng.choice(NAMES), "street": rng.choice(STREETS),
         "day": rng.choice(DAYS), "month": rng.choice(MONTHS), "date": rng.randint(2, 27),
         "start": rng.choice([8, 9, 10]), "end": rng.choice([2, 3, 4]),
         "phone": f"555-{rng.randint(100, 999):03d}{rng.randint(0, 9)}",
         "cross": rng.choice(["Oak Avenue", "5th Street", "Bridge Road", "King Street"])}
    text = (
        f"Subject: Water outage on {f['street']}\n\nDear residents,\n\nOn {f['day']}, "
        f"{f['month']} {f['date']}, the city water department will replace a section of the "
        f"main pipe under {f['street']} near {f['cross']}. Water service to the houses on "
        f"this block will be shut off from {f['start']}:00 a.m. to about {f['end']}:00 p.m. "
        "Crews will put up signs and close one lane of traffic while they work. Please store "
        "some drinking water the night before and keep your taps closed during the outage. "
        "When the water comes back, it may look cloudy for a few minutes; let the cold tap "
        f"run until it is clear. If you have questions, call the department at {f['phone']} "
        "or write to service@cityweb.example. We are sorry for the trouble and thank you for "
        f"your patience.\n\n{f['name']}\nCustomer Service Manager")
    schema = {"type": "object", "properties": {
        "street": {"type": "string"}, "date": {"type": "string"},
        "start_time": {"type": "string"}, "end_time": {"type": "string"},
        "phone": {"type": "string"}, "contact_name": {"type": "string"}},
        "required": ["street", "date", "start_time", "end_time", "phone", "contact_name"],
        "additionalProperties": False}
    return text, schema


def product_page(rng: random.Random) -> tuple[str, dict]:
    cap = rng.choice([28, 32, 40, 45, 55])
    colors = rng.sample(COLORS, 3)
    name = f"{rng.choice(PRODUCTS)} {cap}"
    text = (
        f"The {name} is a hiking backpack for day trips and short overnight hikes. It holds "
        f"{cap} liters and weighs {rng.choice(['1.1', '1.2', '1.4', '0.9'])} kilograms when "
        "empty. The main pocket opens from the top and from the front, so you can reach items "
        "at the bottom without taking everything out. Two side pockets fit a one-liter water "
        "bottle each, and a sleeve inside holds a hydration bladder of up to three liters. "
        "The back panel is made of a breathable mesh that keeps air moving between the pack "
        "and your back. The hip belt has two small zip pockets for a phone or snacks. The "
        f"pack comes in three colors: {colors[0]}, {colors[1]}, and {colors[2]}. It costs "
        f"{rng.choice([69, 79, 89, 99, 119])} dollars and has a "
        f"{rng.choice(['two', 'three', 'five'])}-year warranty.")
    schema = {"type": "object", "properties": {
        "product_name": {"type": "string"}, "capacity_liters": {"type": "integer"},
        "weight_kg": {"type": "number"},
        "colors": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "price_dollars": {"type": "integer"}, "warranty": {"type": "string"}},
        "required": ["product_name", "capacity_liters", "weight_kg", "colors",
                     "price_dollars", "warranty"], "additionalProperties": False}
    return text, schema


def meeting_notes(rng: random.Random) -> tuple[str, dict]:
    team = rng.sample(TEAM, 4)
    month = rng.choice(MONTHS)
    day = rng.randint(2, 12)
    tickets = rng.randint(120, 480)
    text = (
        f"Meeting notes, product team, Monday {day} {month}. Present: {team[0]}, {team[1]}, "
        f"{team[2]}, and {team[3]}. {team[0]} reported that the mobile app update is ready "
        f"for testing and will go to the app store on {day + 14} {month} if no major bugs "
        f"are found. {team[1]} said that the support team received {tickets} tickets last "
        "week, most of them about login problems after the password reset change. "
        f"{team[2]} will fix the password reset email so that the link works for 24 hours "
        f"instead of one hour. {team[3]} presented the results of the customer survey: "
        f"{rng.randint(55, 90)} percent of users are happy with the new design, but many asked "
        "for a dark mode. The team agreed to add dark mode to the plan for the first quarter "
        f"of next year. Next meeting: Monday {day + 7} {month} at 10 a.m.")
    schema = {"type": "object", "properties": {
        "meeting_date": {"type": "string"},
        "attendees": {"type": "array", "items": {"type": "string"}, "maxItems": 6},
        "release_date": {"type": "string"}, "support_tickets": {"type": "integer"},
        "next_meeting": {"type": "string"}},
        "required": ["meeting_date", "attendees", "release_date", "support_tickets",
                     "next_meeting"], "additionalProperties": False}
    return text, schema


def bridge_history(rng: random.Random) -> tuple[str, dict]:
    built = rng.randint(1820, 1899)
    flood = rng.randint(1930, 1975)
    river, town, market = rng.choice(RIVERS), *rng.sample(TOWNS, 2)
    funds = rng.choice(["45,000", "60,000", "28,500", "72,000"])
    text = (
        f"The Old Mill Bridge was built in {built} to carry farm carts across the {river}. "
        f"It is made of local stone and has {rng.choice(['three', 'four', 'five'])} arches, "
        f"each about twelve meters wide. For almost a century it was the only road between "
        f"the village of {town} and the market town of {market}. In {flood} a flood damaged "
        "the middle arch, and the bridge was closed to cars. A new concrete bridge opened two "
        f"kilometers downstream in {flood + 3}. The old bridge was repaired in "
        f"{rng.randint(1990, 2012)} with money from the county and a local fundraising "
        f"campaign that collected {funds} pounds. Today it is open to walkers and cyclists, "
        "and a small museum in the former toll house tells its story. The museum is open on "
        "weekends from April to October.")
    schema = {"type": "object", "properties": {
        "name": {"type": "string"}, "year_built": {"type": "integer"},
        "river": {"type": "string"}, "closed_to_cars_year": {"type": "integer"},
        "repaired_year": {"type": "integer"}, "funds_raised": {"type": "string"}},
        "required": ["name", "year_built", "river", "closed_to_cars_year", "repaired_year",
                     "funds_raised"], "additionalProperties": False}
    return text, schema


PASSAGES = [outage_notice, product_page, meeting_notes, bridge_history]
TYPOS = [("the ", "teh "), ("and ", "adn "), ("water", "watter"), ("which", "wich"),
         ("receive", "recieve"), (" is ", " si "), ("their", "thier"), ("until", "untill")]

REWRITE = ["Proofread the text below: fix spelling and grammar mistakes and return the whole "
           "corrected text, nothing else.\n\n{text}",
           "Rewrite the text below in a more formal tone. Keep every fact, name and number."
           "\n\n{text}",
           "Turn the text below into a list of short bullet points, one fact per point, "
           "using the original wording where you can.\n\n{text}"]
QUOTE = ["Copy, word for word, the sentences from the text below that contain a number or a "
         "date. Put each sentence on its own line and add nothing else.\n\n{text}",
         "Quote the two most important sentences of the text below exactly as written, in "
         "quotation marks.\n\n{text}",
         "Which sentences of this text tell the reader what to do? Quote them exactly.\n\n"
         "{text}"]
JSON = "Extract the details from the text below as JSON that follows this schema:\n{schema}" \
       "\n\nText:\n{text}"
CHAT = ["Write a short story about a cat who learns to swim.",
        "What are some good habits for staying healthy during the winter?",
        "Explain how a rainbow forms, in simple words.",
        "Give me five ideas for a birthday party for my eight-year-old daughter.",
        "What should I pack for a weekend camping trip in the mountains?",
        "Write a friendly email inviting my neighbours to a summer barbecue.",
        "Why do leaves change color in the autumn?",
        "Suggest a simple weekly plan for someone who wants to start running."]
AGENT_SYSTEM = ("You are an assistant that works through the user's files with the tool "
                "read_file(path); the tool results are given to you in the conversation. "
                "Answer with the exact words and numbers from the files.")
AGENT_QUESTIONS = ["I need a summary of the notices in my inbox folder.",
                   "Please go through the documents in the shared folder and tell me the key "
                   "facts of each."]
AGENT_STEPS = ["What are the key facts of this file? Quote the exact words.",
               "Now the same for this file.",
               "Thanks. Now list every date and number from both files, each with the "
               "sentence it appears in, quoted exactly."]


@dataclass
class Prompt:
    """One request of a task. ``turns`` > 0: an agent loop, whose later turns are built from
    the previous turns' answers (``agent_turn``)."""

    task: str
    name: str
    messages: list[dict]
    json_schema: dict | None = None
    files: list[str] = field(default_factory=list)  # agent loop: the tool results, in order
    question: str = ""  # agent loop: the user's request, asked with the first tool result


def add_typos(text: str, rng: random.Random, count: int = 4) -> str:
    for wrong in rng.sample(TYPOS, count):
        text = text.replace(wrong[0], wrong[1], 1)
    return text


def build_prompts(task: str, count: int, seed: int = 0) -> list[Prompt]:
    """``count`` distinct prompts of ``task`` (rewrite | quote | json | agent | chat)."""
    import json

    rng = random.Random(f"{task}-{seed}")
    out: list[Prompt] = []
    for i in range(count):
        text, schema = PASSAGES[i % len(PASSAGES)](rng)
        if task == "rewrite":
            how = REWRITE[i % len(REWRITE)]
            body = how.format(text=add_typos(text, rng) if how.startswith("Proof") else text)
            out.append(Prompt(task, f"rewrite-{i}", [{"role": "user", "content": body}]))
        elif task == "quote":
            body = QUOTE[i % len(QUOTE)].format(text=text)
            out.append(Prompt(task, f"quote-{i}", [{"role": "user", "content": body}]))
        elif task == "json":
            body = JSON.format(schema=json.dumps(schema), text=text)
            out.append(Prompt(task, f"json-{i}", [{"role": "user", "content": body}], schema))
        elif task == "agent":
            files = [PASSAGES[(i + j) % len(PASSAGES)](rng)[0] for j in range(2)]
            messages = [{"role": "system", "content": AGENT_SYSTEM}]
            out.append(Prompt(task, f"agent-{i}", messages, files=files,
                              question=AGENT_QUESTIONS[i % 2]))
        elif task == "chat":
            out.append(Prompt(task, f"chat-{i}", [
                {"role": "user", "content": CHAT[(i + seed) % len(CHAT)]}]))
        else:
            raise ValueError(f"unknown task {task!r}")
    return out


def agent_turn(prompt: Prompt, answers: list[str]) -> list[dict]:
    """The agent loop's messages for turn ``len(answers)``: the first two turns hand the
    model a tool result (a file) and ask for its key facts; the third asks for every date
    and number of both files, so the answer re-reads both tool results. Earlier answers
    are the assistant's turns."""
    messages = list(prompt.messages)
    for turn in range(len(answers) + 1):
        if turn:
            messages.append({"role": "assistant", "content": answers[turn - 1]})
        ask = AGENT_STEPS[turn] if turn else f"{prompt.question}\n\n{AGENT_STEPS[0]}"
        if turn < len(prompt.files):
            ask = (f'read_file("shared/file_{turn + 1}.txt") returned:\n\n'
                   f"{prompt.files[turn]}\n\n{ask}")
        messages.append({"role": "user", "content": ask})
    return messages
