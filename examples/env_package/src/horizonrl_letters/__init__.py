"""An example env package for HorizonRL: ``letters`` (count a letter in a word)."""
