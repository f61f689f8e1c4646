"""`otb-diag report`: the page (`recipe`; what it reads, `settings`), its verdict sentences
(`verdicts`), figure captions and tables (`sections`), provenance (`provenance`) and the HTML
building blocks (`html`)."""
