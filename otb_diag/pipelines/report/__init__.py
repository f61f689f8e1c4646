"""`otb-diag report`: the page (`recipe`), its verdict sentences (`verdicts`), figure captions
and tables (`sections`), provenance (`provenance`) and the HTML building blocks (`html`)."""
