"""SQuAD datasets in the official JSON shape, built in a line (the metric and post-processing
tests share them)."""


def qa(qid, answers, impossible=False):
    return {"id": qid, "question": f"question {qid}?", "is_impossible": impossible,
            "answers": [{"text": a, "answer_start": 0} for a in answers]}


def dataset(*qas):
    return [{"title": "t", "paragraphs": [{"context": "unused by the metric", "qas": list(qas)}]}]
