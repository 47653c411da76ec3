// placeholder: filled by the family's author
