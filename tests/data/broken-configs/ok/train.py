print("never runs: every launch in the corpus fails")
