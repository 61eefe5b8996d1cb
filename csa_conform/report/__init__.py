"""What a run leaves for people and CI: merged results documents, JUnit and the HTML page."""
