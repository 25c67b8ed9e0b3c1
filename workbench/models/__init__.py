"""Small models built to produce the bundled captures."""
