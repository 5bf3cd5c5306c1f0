"""The sections a notebook may skip live in utils.core.sections.OPTIONAL_SECTIONS (one list for lessons and tests)."""

from utils.core.sections import OPTIONAL_SECTIONS

GPU_ONLY_SECTIONS = {section: cap for section, (cap, _what) in OPTIONAL_SECTIONS.items()}
