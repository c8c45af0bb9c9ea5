"""Tokens and texts of a task: queries from every supported dataset (`queries`), the task's token operations
(formatting, truncation, penalties, decoding: `tasks`) and the summarization tasks' readers (`summarize`)."""
