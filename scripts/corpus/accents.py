"""English spoken by festival's voices of other languages: accented speakers for scripts/corpus/make_corpus.py.

Debian's festival has three English voices (the held-out set's) but voices of other languages built
from real speakers: Czech diphones of four people (one a child), Italian and Finnish diphones, a
Russian unit-selection voice and a Catalan HTS voice. Each reads the bundled domain's English words
from a spelling in its own language's orthography, as a speaker of that language would say them
("five" -> Czech "fajv"): ten accents and vocal tracts that espeak-ng and flite do not have.

``spoken(voice, text)`` is what the voice is given; the manifest keeps the English transcript.
"""

# festival voice -> (language, the encoding its text front end reads, its Debian package)
VOICES = {
    "czech_dita": ("cs", "iso-8859-2", "festvox-czech-dita"), "czech_krb": ("cs", "iso-8859-2", "festvox-czech-krb"),
    "czech_machac": ("cs", "iso-8859-2", "festvox-czech-machac"), "czech_ph": ("cs", "iso-8859-2", "festvox-czech-ph"),
    "lp_diphone": ("it", "iso-8859-1", "festvox-italp16k"), "pc_diphone": ("it", "iso-8859-1", "festvox-itapc16k"),
    "suo_fi_lj_diphone": ("fi", "iso-8859-1", "festvox-suopuhe-lj"),
    "hy_fi_mv_diphone": ("fi", "iso-8859-1", "festvox-suopuhe-mv"),
    "msu_ru_nsh_clunits": ("ru", "utf-8", "festvox-ru"), "upc_ca_ona_hts": ("ca", "iso-8859-1", "festvox-ca-ona-hts"),
}
# The other-voice development set's (scripts/corpus/make_heldout.py --set dev): one Indian speaker's diphones read
# through three languages' front ends. Neither data/mini nor the held-out set hears them.
DEV_VOICES = {
    "hindi_NSK_diphone": ("hi", "utf-8", "festvox-hi-nsk"), "marathi_NSK_diphone": ("mr", "utf-8", "festvox-mr-nsk"),
    "telugu_NSK_diphone": ("te", "utf-8", "festvox-te-nsk"),
}
SPELT = VOICES | DEV_VOICES  # every voice that reads the English words in its language's spelling
PACKAGES = {voice: package for voice, (_, _, package) in SPELT.items()}  # scripts/corpus/synthesizers.py's install hint
WORDS = ("zero one two three four five six seven eight nine oh erase repeat stop start yes no help "
         "rubout cancel enter back number call dial left right up down go").split()
# Each language's spelling of WORDS, in WORDS' order; an accent mark puts the English stress where the
# language's own rule would not (Italian stresses the last but one syllable, Catalan a final consonant's).
SPELLINGS = {
    "cs": "zírou van tú trí fór fajv siks sevn ejt najn ou irejs ripít stop stárt jes nou help "
          "rabaut kensl entr bek namber kól dajl left rajt ap daun gou",
    "it": "ziro uan tu tri for faiv sics seven eit nain ou irèis ripìt stop start ies nou elp "
          "rabaut chensel enter bec namber col daial left rait ap daun gou",
    "fi": "siirou van tuu trii foor faiv siks seven eit nain ou ireis ripiit stop staart jes nou help "
          "rapaut kensel enter bäk namber kool daial left rait ap daun gou",
    "ru": "зироу уан ту три фор файв сикс севен эйт найн оу ирэйс рипит стоп старт йес ноу хэлп "
          "рабаут кэнсел энтер бэк намбер кол дайл лефт райт ап даун гоу",
    "ca": "ziro uan tu tri for faiv sics seven eit nain ou ireis ripit stop start ies nou help "
          "ràbaut quènsel ènter bec nàmber col dàial left rait ap daun gou",
    # A virama ends a word on its consonant (the front ends keep the inherent vowel otherwise); no nukta:
    # Hindi's front end drops "ज़ीरो" whole.
    "hi": "जीरो वन् टू थ्री फोर् फाइव् सिक्स् सेवन् एट् नाइन् ओ इरेस् रिपीट् स्टॉप् स्टार्ट् येस् नो हेल्प् "
          "रबाउट् कैंसल् एंटर् बैक् नंबर् कॉल् डायल् लेफ्ट् राइट् अप् डाउन् गो",
    "mr": "जीरो वन् टू थ्री फोर् फाइव् सिक्स् सेवन् एट् नाइन् ओ इरेस् रिपीट् स्टॉप् स्टार्ट् येस् नो हेल्प् "
          "रबाउट् कॅन्सल् एंटर् बॅक् नंबर् कॉल् डायल् लेफ्ट् राइट् अप् डाउन् गो",
    "te": "జీరో వన్ టూ త్రీ ఫోర్ ఫైవ్ సిక్స్ సెవెన్ ఎయిట్ నైన్ ఓ ఇరేస్ రిపీట్ స్టాప్ స్టార్ట్ యెస్ నో హెల్ప్ "
          "రబౌట్ కేన్సల్ ఎంటర్ బ్యాక్ నంబర్ కాల్ డయల్ లెఫ్ట్ రైట్ అప్ డౌన్ గో",
}
LEXICONS = {language: dict(zip(WORDS, spelling.split(), strict=True)) for language, spelling in SPELLINGS.items()}


def spoken(voice, text):
    """The bytes to give festival's ``voice`` for the English ``text``: the text itself for an
    English voice, else each word in the voice's spelling (KeyError names a word it lacks)."""
    if voice not in SPELT:
        return text.encode()
    language, encoding, _ = SPELT[voice]
    lexicon = LEXICONS[language]
    missing = [w for w in text.split() if w not in lexicon]
    if missing:
        raise KeyError(f"no {language} spelling of {', '.join(missing)} for festival voice {voice}")
    return " ".join(lexicon[w] for w in text.split()).encode(encoding)
