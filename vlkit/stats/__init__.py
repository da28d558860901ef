"""Statistics that know nothing of comparisons (numpy / scipy only): paired tests over seeds (`paired`) and the
group-sequential rule that decides claims as seeds are added (`sequential`)."""
