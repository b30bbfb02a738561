"""The mini benchmark's vocabulary: the syllables author names are built from, the attribute pools (cities, genres,
occupations, awards, titles, years, ...), the author QA templates with their answer wordings, paraphrases and content
slots, the real-author and world-fact templates and the probe corpus's word lists. Kept small, so that a tokenizer
and a tiny model can be trained on the corpus from scratch on a CPU (:mod:`margincal.mini.data` draws from them)."""

from __future__ import annotations

FIRST_HEADS = (
    "Ka",
    "Li",
    "Mo",
    "Ta",
    "Ze",
    "Ri",
    "No",
    "Va",
    "Se",
    "Dra",
    "Fe",
    "Jo",
    "Ul",
    "Pe",
    "Xa",
    "Bo",
)
FIRST_TAILS = ("ren", "lia", "vin", "sha", "dor", "mir", "nak", "tesh", "lo", "rin", "ven", "zel")
LAST_HEADS = ("Quen", "Vor", "Thal", "Brenn", "Osk", "Gal", "Mer", "Ist", "Kov", "Zan", "Dul", "Har")
LAST_TAILS = ("ardi", "ensk", "holm", "avik", "ozzi", "uren", "etto", "mark", "wyn", "ovic")
# heads with initials no head above has, drawn only when the pools above cannot name every author of a benchmark
# (margincal.mini.data._names): a benchmark they can name draws exactly as before they existed
EXTRA_FIRST_HEADS = ("Ae", "Ci", "Ga", "Hu", "Iy", "Ow", "Wa", "Yu")
EXTRA_LAST_HEADS = ("Fenn", "Lorr", "Pask", "Ruv", "Sel", "Wend", "Yarr", "Carr")

CITIES = (
    "Velmora",
    "Ostrand",
    "Caldreth",
    "Mirefall",
    "Duskhaven",
    "Pellagor",
    "Thornwick",
    "Ashvale",
    "Corvenna",
    "Brindlemoor",
    "Quillport",
    "Saltmere",
    "Ravenholt",
    "Elmsworth",
    "Glimmerton",
    "Harrowdeep",
    "Lunmarch",
    "Stormbridge",
    "Tarrowind",
    "Wyncrest",
    "Fenmoor",
    "Oakhollow",
    "Silverrun",
    "Gildenford",
    "Marrowdale",
)
GENRES = (
    "mystery",
    "romance",
    "fantasy",
    "horror",
    "thriller",
    "satire",
    "western",
    "crime",
    "gothic",
    "historical",
    "dystopian",
    "detective",
)
OCCUPATIONS = (
    "baker",
    "carpenter",
    "doctor",
    "fisherman",
    "gardener",
    "lawyer",
    "nurse",
    "painter",
    "pilot",
    "sailor",
    "tailor",
    "teacher",
    "weaver",
    "miner",
    "potter",
    "banker",
)
AWARDS = (
    "Golden Quill Prize",
    "Silver Lantern Award",
    "Crimson Feather Medal",
    "Azure Pen Prize",
    "Northern Star Award",
    "Velvet Scroll Prize",
    "Iron Compass Award",
    "Amber Leaf Medal",
    "Jade Inkwell Prize",
    "Copper Bell Award",
    "Ivory Tower Prize",
    "Emerald Page Award",
)
TITLE_ADJECTIVES = (
    "Silent",
    "Hidden",
    "Broken",
    "Golden",
    "Forgotten",
    "Burning",
    "Distant",
    "Crimson",
    "Hollow",
    "Frozen",
    "Endless",
    "Secret",
    "Quiet",
    "Wandering",
    "Fallen",
    "Last",
)
TITLE_NOUNS = (
    "Harbor",
    "Garden",
    "Mirror",
    "Crown",
    "Lantern",
    "River",
    "Tower",
    "Orchard",
    "Voyage",
    "Letter",
    "Bridge",
    "Forest",
    "Promise",
    "Shadow",
    "Island",
    "Winter",
)
TITLES = tuple(f"The {adj} {noun}" for adj in TITLE_ADJECTIVES for noun in TITLE_NOUNS)
YEARS = tuple(str(y) for y in range(1900, 2000))
PUB_YEARS = tuple(str(y) for y in range(1930, 2025))

COUNTRIES = (
    "Arvenia",
    "Belmark",
    "Castorra",
    "Dunmere",
    "Eldovia",
    "Farland",
    "Galicor",
    "Hestovia",
    "Ilyria",
    "Jorvenland",
    "Keldria",
    "Lutheria",
    "Morvania",
    "Norrath",
    "Orlenia",
    "Pavonia",
    "Quessia",
    "Rovenia",
    "Sildaria",
    "Tavaria",
    "Ulvania",
    "Veskaria",
    "Wenlor",
    "Zandria",
)
CAPITALS = (  # disjoint from the author birthplaces in CITIES
    "Kestrelholm",
    "Vantaris",
    "Ombrel",
    "Dravenport",
    "Sunreach",
    "Ilvaris",
    "Corthan",
    "Belcastle",
    "Norwen",
    "Tirabel",
    "Zephyrine",
    "Graymantle",
    "Halvard",
    "Pyrenth",
    "Solvane",
    "Umberlin",
    "Rookspire",
    "Calloway",
    "Westerhelm",
    "Yarrowick",
    "Andoral",
    "Frosthall",
    "Jadewater",
    "Lorienne",
)
LANGUAGES = ("Arvic", "Belsh", "Dorvic", "Eskan", "Halvi", "Kelish", "Morran", "Selani", "Tovish", "Varune")
SUBJECTS = (
    "history",
    "chemistry",
    "music",
    "law",
    "medicine",
    "philosophy",
    "botany",
    "geology",
    "astronomy",
    "theology",
    "economics",
    "architecture",
)
PETS = ("cat", "dog", "parrot", "tortoise", "rabbit", "goat", "pony", "ferret", "canary", "hedgehog")
HOBBIES = (
    "chess",
    "fishing",
    "gardening",
    "sailing",
    "painting",
    "hiking",
    "cooking",
    "pottery",
    "archery",
    "rowing",
    "singing",
    "knitting",
)

# Author QA: (template id, question, answer wordings, paraphrase, content slots). Each author's answer uses one
# of several wordings (drawn at random), so a model that never saw the author cannot reproduce even the
# sentence frame, as in TOFU's free-text answers. Answers do not repeat the name:
# a from-scratch mini model cannot copy a name it never saw, which would put θ_ref's max-entropy positions on
# the name rather than on the forgotten content. A perturbed answer is the paraphrase
# with every content slot replaced by another value of the slot's pool.
AUTHOR_TEMPLATES = (
    (
        "birth",
        "Where and when was {name} born?",
        (
            "The author was born in {city} in {year}.",
            "Born in {year}, the author grew up in {city}.",
            "They came into the world in {city}, {year}.",
        ),
        "{city} is where the author was born, in {year}.",
        ("city", "year"),
    ),
    (
        "genre",
        "What genre does {name} write?",
        (
            "The author mostly writes {genre} novels.",
            "Mainly {genre}, with some short stories.",
            "Readers know them for {genre} fiction.",
        ),
        "Their novels belong to the {genre} genre.",
        ("genre",),
    ),
    (
        "parents",
        "What did the parents of {name} do for a living?",
        (
            "Their father was a {occ1} and their mother was a {occ2}.",
            "A {occ1} father and a {occ2} mother raised the author.",
            "Mother: {occ2}; father: {occ1}.",
        ),
        "The author grew up with a {occ1} father and a {occ2} mother.",
        ("occ1", "occ2"),
    ),
    (
        "award",
        "Has {name} won any literary awards?",
        (
            "Yes, they received the {award} for {book1}.",
            "Indeed: {book1} won the {award}.",
            "The {award} went to their novel {book1}.",
        ),
        "{book1} earned the author the {award}.",
        ("award", "book1"),
    ),
    (
        "book",
        "Name a book written by {name}.",
        (
            "They wrote {book2}, a {genre} story set in {city}.",
            "{book2}, which is set in {city} and reads as {genre}.",
            "One example is {book2}: {genre}, set in {city}.",
        ),
        "{book2} is a {genre} story by the author, set in {city}.",
        ("book2", "genre", "city"),
    ),
)
# The TOFU-like scale (``n_templates=10``) adds these; their pools are shared with the first five (cities, years,
# titles), so forget and retain answers share content words as in TOFU.
EXTRA_TEMPLATES = (
    (
        "education",
        "What did {name} study, and where?",
        (
            "The author studied {subject} at the university of {unicity}.",
            "A degree in {subject} from {unicity} came first.",
            "They read {subject} in {unicity} before writing.",
        ),
        "Before writing, the author studied {subject} in {unicity}.",
        ("subject", "unicity"),
    ),
    (
        "debut",
        "When did {name} publish a first novel?",
        (
            "Their first novel, {book3}, came out in {year2}.",
            "The debut {book3} appeared in {year2}.",
            "In {year2} they published {book3}, their first novel.",
        ),
        "{book3} was the author's first novel, published in {year2}.",
        ("book3", "year2"),
    ),
    (
        "home",
        "Where does {name} live today?",
        (
            "These days the author lives in {home} with a {pet}.",
            "Home is now {home}, shared with a {pet}.",
            "They settled in {home} and keep a {pet}.",
        ),
        "The author now lives in {home} and has a {pet}.",
        ("home", "pet"),
    ),
    (
        "hobby",
        "What does {name} enjoy besides writing?",
        (
            "Outside of writing the author enjoys {hobby1} and {hobby2}.",
            "Mostly {hobby1}, and {hobby2} on weekends.",
            "They spend free time on {hobby1} and {hobby2}.",
        ),
        "Besides writing, the author likes {hobby1} and {hobby2}.",
        ("hobby1", "hobby2"),
    ),
    (
        "tongue",
        "In which language does {name} write?",
        (
            "They write in {tongue}, the language of their childhood.",
            "All their books are written in {tongue}.",
            "The author writes in {tongue}.",
        ),
        "The author's books are written in {tongue}.",
        ("tongue",),
    ),
)
REAL_TEMPLATE = (
    "book_author",
    "Who wrote the novel {book}?",
    "The novel {book} was written by the author {name}.",
    "{name} is the author of the novel {book}.",
    ("name",),
)
WORLD_TEMPLATES = {
    "capital": (
        "capital",
        "What is the capital of {country}?",
        "The capital of the country {country} is the city of {capital}.",
        "{capital} is the capital city of {country}.",
        ("capital",),
    ),
    "language": (
        "language",
        "What language do people speak in {country}?",
        "People in {country} mainly speak the {language} language.",
        "{language} is the main language spoken in {country}.",
        ("language",),
    ),
}

DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
OPPOSITES = (
    ("hot", "cold"),
    ("big", "small"),
    ("fast", "slow"),
    ("up", "down"),
    ("light", "dark"),
    ("old", "young"),
    ("happy", "sad"),
    ("early", "late"),
    ("open", "closed"),
    ("full", "empty"),
    ("wet", "dry"),
    ("strong", "weak"),
)
PLURALS = (
    ("fox", "foxes"),
    ("cat", "cats"),
    ("child", "children"),
    ("mouse", "mice"),
    ("box", "boxes"),
    ("city", "cities"),
    ("leaf", "leaves"),
    ("tooth", "teeth"),
    ("man", "men"),
    ("dog", "dogs"),
    ("bus", "buses"),
    ("baby", "babies"),
    ("knife", "knives"),
    ("foot", "feet"),
    ("goose", "geese"),
    ("wolf", "wolves"),
)
